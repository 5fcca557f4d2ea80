/* The C API's ops with bodies, from C: recomputable ops (spw_recomputable_op), which plans run
 * again instead of keeping what they wrote, and host-capable ops (spw_host_capable_op), which
 * plans may run on the host. A small chain of layers trained a few steps gives the same bits at
 * every setting as with everything resident; failures and misuse inside a body come back as the
 * status and message they stand for. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "capi/spillway.h"
#include "capi_check.h"

enum { N = 1024, LAYERS = 6, STEPS = 4 }; /* floats per tensor: 4 KiB */

/* ---- the chain -------------------------------------------------------------------------------- */

/* out = in * 0.5 + w (the first layer's input made from the step). Reruns count in `calls`; each
 * run's spw_op_seed is compared with the first run's (`seed`, 0 until then), a difference counted
 * in `seed_differs`. */
struct layer {
  spw_tensor w, in, out;
  int first, step;
  int* calls;
  uint64_t seed;
  int* seed_differs;
};
static void layer_on_host(const spw_host* h, void* user) {
  const struct layer* l = user;
  const float* w = spw_host_ptr(h, l->w);
  const float* in = l->first ? NULL : spw_host_ptr(h, l->in);
  float* out = spw_host_ptr(h, l->out);
  for (int i = 0; i < N; ++i) out[i] = (in != NULL ? in[i] : (float)(l->step + i % 7)) * 0.5f + w[i];
}
static int failing_call; /* the forward body's run, counted over a training, that fails (0: none) */
static spw_status layer_forward(spw_op* op, void* user) {
  const struct layer* l = user;
  if (++*l->calls == failing_call) return SPW_ERR_IO;
  struct layer* m = user;
  const uint64_t seed = spw_op_seed(op);
  if (m->seed == 0) m->seed = seed;
  if (seed != m->seed || seed == 0) ++*m->seed_differs;
  return spw_op_run(op, layer_on_host, user);
}

/* g += in * d; d = d * w (the gradient flowing back). */
struct back {
  spw_tensor w, in, d, g;
};
static void layer_backward(const spw_host* h, void* user) {
  const struct back* b = user;
  const float* w = spw_host_ptr(h, b->w);
  const float* in = spw_host_ptr(h, b->in);
  float* d = spw_host_ptr(h, b->d);
  float* g = spw_host_ptr(h, b->g);
  for (int i = 0; i < N; ++i) {
    g[i] += in[i] * d[i];
    d[i] = d[i] * w[i] * 0.25f;
  }
}
static void seed_gradient(const spw_host* h, void* user) {
  const struct back* b = user;
  const float* out = spw_host_ptr(h, b->in);
  float* d = spw_host_ptr(h, b->d);
  for (int i = 0; i < N; ++i) d[i] = out[i] * 1e-3f;
}

/* w -= 1e-3 * g, as the device's body and the host's alike; each side counts its runs. */
struct update {
  spw_tensor w, g;
  int *device_runs, *host_runs;
};
static void update_on_host(const spw_host* h, void* user) {
  const struct update* u = user;
  float* w = spw_host_ptr(h, u->w);
  const float* g = spw_host_ptr(h, u->g);
  for (int i = 0; i < N; ++i) w[i] -= 1e-3f * g[i];
}
static spw_status update_device(spw_op* op, void* user) {
  const struct update* u = user;
  ++*u->device_runs;
  return spw_op_run(op, update_on_host, user);
}
static void update_host(const spw_host* h, void* user) {
  const struct update* u = user;
  ++*u->host_runs;
  update_on_host(h, user);
}


/* What a run gave: the weights after STEPS steps, how often each body ran, and the first step
 * whose backward pass failed (a rerun's body failing), which the loop gave up. */
struct outcome {
  float w[LAYERS][N];
  int forward_calls, device_updates, host_updates;
  int seed_differs; /* forward runs whose spw_op_seed was not their first run's */
  uint64_t first_seeds[STEPS][LAYERS];
  int failed_step;
  spw_status failure;
  char message[512];
};

/* STEPS steps of the chain under the session settings `json` (a failing call counts a failure). */
static void train(const char* json, struct outcome* o) {
  memset(o, 0, sizeof *o);
  o->failed_step = -1;
  spw_session* s;
  OK(spw_session_from_json_text(json, &s));
  spw_tensor w[LAYERS], g[LAYERS];
  float init[N];
  for (int l = 0; l < LAYERS; ++l) {
    char name[32];
    for (int i = 0; i < N; ++i) init[i] = (float)((i * 7 + l * 13) % 17) * 0.0625f;
    snprintf(name, sizeof name, "w%d", l);
    OK(spw_add_persistent(s, name, sizeof init, SPW_PARAMETER, init, &w[l]));
    snprintf(name, sizeof name, "g%d", l);
    OK(spw_add_persistent(s, name, sizeof init, SPW_GRADIENT, NULL, &g[l]));
  }
  struct layer layers[LAYERS]; /* the bodies' data: valid until each step's end */
  struct update updates[LAYERS];
  for (int step = 0; step < STEPS; ++step) {
    OK(spw_begin_iteration(s, "train"));
    spw_tensor a[LAYERS + 1];
    for (int l = 0; l < LAYERS; ++l) {
      char name[32];
      snprintf(name, sizeof name, "a%d", l + 1);
      OK(spw_add_transient(s, name, sizeof init, SPW_ACTIVATION, &a[l + 1]));
      layers[l] = (struct layer){w[l], a[l], a[l + 1], l == 0, step, &o->forward_calls, 0, &o->seed_differs};
      const spw_tensor reads[] = {w[l], a[l]};
      snprintf(name, sizeof name, "l%d.forward", l);
      OK(spw_recomputable_op(s, name, reads, l == 0 ? 1 : 2, &a[l + 1], 1, layer_forward, &layers[l], 0));
    }
    spw_tensor d;
    OK(spw_add_transient(s, "d", sizeof init, SPW_ACTIVATION, &d));
    struct back seed = {w[0], a[LAYERS], d, g[0]};
    OK(run_op(s, "loss.backward", &a[LAYERS], 1, &d, 1, NULL, 0, seed_gradient, &seed));
    OK(spw_release(s, a[LAYERS]));
    spw_status st = SPW_OK; /* a rerun before a backward op may fail: the loop gives the step up */
    for (int l = LAYERS - 1; l >= 1 && st == SPW_OK; --l) {
      struct back b = {w[l], a[l], d, g[l]};
      const spw_tensor reads[] = {w[l], a[l], d};
      char name[32];
      snprintf(name, sizeof name, "l%d.backward", l);
      st = run_op(s, name, reads, 3, &d, 1, &g[l], 1, layer_backward, &b);
      if (st == SPW_OK) st = spw_release(s, a[l]);
    }
    if (st != SPW_OK) {
      if (o->failed_step < 0) {
        o->failed_step = step, o->failure = st;
        snprintf(o->message, sizeof o->message, "%s", spw_last_error());
      }
      OK(spw_abandon_iteration(s));
      continue;
    }
    OK(spw_release(s, d));
    for (int l = 1; l < LAYERS; ++l) {
      char name[32];
      snprintf(name, sizeof name, "l%d.adam", l);
      updates[l] = (struct update){w[l], g[l], &o->device_updates, &o->host_updates};
      const spw_tensor reads[] = {w[l], g[l]};
      OK(spw_host_capable_op(s, name, reads, 2, &w[l], 1, update_device, update_host, &updates[l], 0, 0));
    }
    spw_iteration_report r;
    OK(spw_end_iteration(s, &r));
    for (int l = 0; l < LAYERS; ++l) o->first_seeds[step][l] = layers[l].seed;
  }
  for (int l = 0; l < LAYERS; ++l) OK(spw_read(s, w[l], o->w[l], sizeof o->w[l]));
  spw_session_destroy(s);
}

/* ---- cases ----------------------------------------------------------------------------------- */

#define SETTINGS(policy, ratio, host_ops)                                                             \
  "{\"backend\": \"cpu\", \"cpu_device_memory\": \"16MiB\", \"policy\": \"" policy "\", "             \
  "\"device_budget_ratio\": " ratio ", \"host_ops\": \"" host_ops "\"}"

/* The chain at every policy that recomputes, at half and a third of its footprint, gives the bits
 * of the everything-resident run; under checkpoint the forward bodies ran again. */
static void recomputed_chains_give_the_same_bits(void) {
  static struct outcome resident, o;
  train(SETTINGS("none", "1", "device"), &resident);
  if (failures) return;
  CHECK(resident.failed_step < 0);
  CHECK(resident.forward_calls == LAYERS * STEPS);
  const char* settings[] = {SETTINGS("checkpoint", "0.5", "device"), SETTINGS("checkpoint", "0.34", "device"),
                            SETTINGS("capuchin", "0.5", "device"), SETTINGS("auto", "0.34", "device")};
  for (size_t k = 0; k < sizeof settings / sizeof settings[0]; ++k) {
    train(settings[k], &o);
    if (failures) return;
    CHECK(o.failed_step < 0);
    if (memcmp(o.w, resident.w, sizeof o.w) != 0) {
      fprintf(stderr, "%s: weights differ from the everything-resident run\n", settings[k]);
      ++failures;
    }
    if (k == 0) CHECK(o.forward_calls > LAYERS * STEPS); /* reruns happened */
    CHECK(o.seed_differs == 0); /* each rerun saw its first run's spw_op_seed */
  }
  /* one seed per op and step: no two alike (resident's, from the steps that ran whole) */
  for (int i = 0; i < STEPS * LAYERS; ++i)
    for (int j = i + 1; j < STEPS * LAYERS; ++j)
      CHECK(resident.first_seeds[i / LAYERS][i % LAYERS] != resident.first_seeds[j / LAYERS][j % LAYERS]);
}

/* The updates as host-capable ops: placed on the host by host_ops "host", on the device by
 * "device", the same bits either way. */
static void host_capable_updates_give_the_same_bits(void) {
  static struct outcome device, host;
  train(SETTINGS("auto", "0.5", "device"), &device);
  train(SETTINGS("auto", "0.5", "host"), &host);
  if (failures) return;
  CHECK(device.host_updates == 0 && device.device_updates == (LAYERS - 1) * STEPS);
  CHECK(host.host_updates > 0);
  CHECK(host.host_updates + host.device_updates == (LAYERS - 1) * STEPS);
  CHECK(memcmp(host.w, device.w, sizeof host.w) == 0);
  CHECK(host.failed_step < 0 && device.failed_step < 0);
}

/* A rerun whose body fails (its own code, at the first rerun of the first planned step): the
 * backward op that needed it returns that status, with a message naming the op run again; the
 * loop gives the step up, and the later steps run and rerun as before. */
static void a_failing_rerun_fails_the_op_that_needed_it(void) {
  static struct outcome o;
  failing_call = 2 * LAYERS + 1; /* step 0 records (LAYERS runs), step 1 runs LAYERS, then reruns */
  train(SETTINGS("checkpoint", "0.5", "device"), &o);
  failing_call = 0;
  if (failures) return;
  CHECK(o.failed_step == 1);
  CHECK(o.failure == SPW_ERR_IO);
  CHECK(strstr(o.message, ".forward\": its body returned the status io") != NULL);
  CHECK(o.forward_calls > LAYERS * STEPS + 2); /* the steps after it ran and reran */
  if (failures) fprintf(stderr, "failed step %d, status %s, message: %s\n", o.failed_step, spw_status_name(o.failure), o.message);
}

/* Bodies that fail, and misuse, each an error with its status and a message that names it. */
static spw_status returns_config_error(spw_op* op, void* user) {
  (void)op, (void)user;
  return SPW_ERR_CONFIG;
}
static spw_status asks_for_an_unnamed_pointer(spw_op* op, void* user) {
  void* p = NULL;
  return spw_op_ptr(op, *(const spw_tensor*)user, &p);
}
static spw_status ends_its_own_op(spw_op* op, void* user) {
  (void)user;
  return spw_op_end(op);
}
static void does_nothing(const spw_host* h, void* user) { (void)h, (void)user; }

static void body_failures_and_misuse(void) {
  spw_session* s;
  OK(spw_session_from_json_text(SETTINGS("none", "1", "auto"), &s));
  float init[N] = {0};
  spw_tensor w, x;
  OK(spw_add_persistent(s, "w", sizeof init, SPW_PARAMETER, init, &w));
  OK(spw_begin_iteration(s, "train"));
  OK(spw_add_transient(s, "x", sizeof init, SPW_ACTIVATION, &x));
  FAILS(spw_recomputable_op(s, "x.forward", &w, 1, &x, 1, returns_config_error, NULL, 0), SPW_ERR_CONFIG,
        "op \"x.forward\": its body returned the status config");
  OK(spw_abandon_iteration(s));
  OK(spw_begin_iteration(s, "train"));
  OK(spw_add_transient(s, "x", sizeof init, SPW_ACTIVATION, &x));
  spw_tensor other;
  OK(spw_add_transient(s, "other", sizeof init, SPW_ACTIVATION, &other));
  FAILS(spw_recomputable_op(s, "x.forward", &w, 1, &x, 1, asks_for_an_unnamed_pointer, &other, 0), SPW_ERR_USAGE,
        "asked for the pointer of tensor \"other\", which it does not name");
  FAILS(spw_recomputable_op(s, "x.forward", NULL, 0, &x, 1, ends_its_own_op, NULL, 0), SPW_ERR_USAGE,
        "return from the body instead");
  FAILS(spw_recomputable_op(s, "w.forward", NULL, 0, &w, 1, returns_config_error, NULL, 0), SPW_ERR_USAGE,
        "recomputable_op(\"w.forward\"): writes parameter \"w\"");
  FAILS(spw_recomputable_op(s, "x.forward", NULL, 0, &x, 1, NULL, NULL, 0), SPW_ERR_USAGE, "body is NULL");
  FAILS(spw_host_capable_op(s, "w.adam", &w, 1, &w, 1, returns_config_error, NULL, NULL, 0, 0), SPW_ERR_USAGE,
        "host_body is NULL");
  FAILS(spw_host_capable_op(s, "w.adam", &w, 1, &w, 1, returns_config_error, does_nothing, NULL, 0, 0),
        SPW_ERR_CONFIG, "op \"w.adam\": its body returned the status config");
  OK(spw_abandon_iteration(s));
  spw_session_destroy(s);
}

static const capi_case cases[] = {
    {"recomputed_chains_give_the_same_bits", recomputed_chains_give_the_same_bits},
    {"host_capable_updates_give_the_same_bits", host_capable_updates_give_the_same_bits},
    {"body_failures_and_misuse", body_failures_and_misuse},
    {"a_failing_rerun_fails_the_op_that_needed_it", a_failing_rerun_fails_the_op_that_needed_it},
};

int main(int argc, char** argv) { return run_case(cases, sizeof cases / sizeof cases[0], argc, argv); }
