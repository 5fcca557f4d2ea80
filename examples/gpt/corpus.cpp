// Corpus loading and the sentence generator (subjects, verbs, objects and clauses about water,
// rivers and machines, joined by a few templates).
#include "examples/gpt/corpus.hpp"

#include <array>
#include <string_view>

#include "device/error.hpp"
#include "offload/text_file.hpp"
#include "examples/common/random.hpp"

namespace spillway::examples {

std::string load_corpus(const std::string& path, std::size_t min_bytes) {
  std::string text;
  try {
    text = offload::read_text_file(path, "the corpus", "a text file (its bytes are the tokens)");
  } catch (const config_error& e) {
    throw config_error("--data " + std::string(e.what()));
  }
  if (text.size() < min_bytes)
    throw config_error("--data " + path + ": the corpus has " + std::to_string(text.size()) +
                       " bytes; the model needs at least " + std::to_string(min_bytes) + " (one sequence and its target)");
  return text;
}

namespace {

constexpr std::array<std::string_view, 16> subjects = {
    "the river", "a small boat", "the old miller", "the night shift", "every gate", "the keeper",
    "a cold wind", "the engine", "the town below", "a child on the bank", "the first barge",
    "the water", "our neighbour", "the spillway", "the long bridge", "a heron"};
constexpr std::array<std::string_view, 16> verbs = {
    "carries", "watches", "remembers", "follows", "waits for", "counts", "opens", "holds back",
    "lifts", "finds", "hears", "measures", "crosses", "turns toward", "keeps", "leaves"};
constexpr std::array<std::string_view, 16> objects = {
    "the morning fog", "a basket of apples", "the lower field", "three grey stones", "the harbour lights",
    "the last of the rain", "a letter from the coast", "the iron wheel", "the quiet mill",
    "a line of willows", "the narrow channel", "the evening train", "a lantern", "the flood marks",
    "the market square", "the sound of the weir"};
constexpr std::array<std::string_view, 12> clauses = {
    "before the sun is high", "while the valley sleeps", "as the water rises", "when the bell rings",
    "after the storm has passed", "because the dam is full", "until the tide turns",
    "although nobody is looking", "as it has done for years", "once the gates are set",
    "whenever the snow melts", "long after dark"};
constexpr std::array<std::string_view, 8> adverbs = {
    "slowly", "again", "without a word", "at dawn", "with care", "in silence", "every spring", "by hand"};

template <std::size_t N>
std::string_view pick(rng& r, const std::array<std::string_view, N>& words) {
  return words[r.below(N)];
}

void capitalise_into(std::string& out, std::string_view s) {
  if (s.empty()) return;
  char c = s[0];
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  out += c;
  out += s.substr(1);
}

/// "the keeper carries the rope": a subject, a verb and an object, drawn in that order.
std::string subject_verb_object(rng& r) {
  std::string s(pick(r, subjects));
  s += ' ';
  s += pick(r, verbs);
  s += ' ';
  s += pick(r, objects);
  return s;
}

}  // namespace

std::string generate_corpus(std::uint64_t seed, std::size_t bytes) {
  rng r(seed, 0x636f72707573ULL);  // "corpus"
  std::string out;
  out.reserve(bytes + 256);
  int in_paragraph = 0;
  while (out.size() < bytes) {
    std::string s;
    switch (r.below(4)) {
      case 0:
        capitalise_into(s, subject_verb_object(r));
        s += '.';
        break;
      case 1:
        capitalise_into(s, pick(r, clauses));
        s += ", ";
        s += subject_verb_object(r);
        s += '.';
        break;
      case 2:
        capitalise_into(s, subject_verb_object(r));
        s += ' ';
        s += pick(r, adverbs);
        s += ", and ";
        s += pick(r, subjects);
        s += ' ';
        s += pick(r, verbs);
        s += " it ";
        s += pick(r, clauses);
        s += '.';
        break;
      default:
        s += "Does ";
        s += pick(r, subjects);
        s += ' ';
        std::string_view v = pick(r, verbs);
        // "carries" -> "carry", "watches" -> "watch": the question takes the bare verb.
        std::string bare(v.substr(0, v.find(' ')));
        std::string rest(v.find(' ') == std::string_view::npos ? "" : v.substr(v.find(' ')));
        if (bare.ends_with("ies")) bare = bare.substr(0, bare.size() - 3) + "y";
        else if (bare.ends_with("ches") || bare.ends_with("shes") || bare.ends_with("sses")) bare.resize(bare.size() - 2);
        else if (bare.ends_with("s")) bare.pop_back();
        s += bare + rest + ' ';
        s += pick(r, objects);
        s += ' ';
        s += pick(r, clauses);
        s += '?';
        break;
    }
    out += s;
    if (++in_paragraph >= 4 + static_cast<int>(r.below(4))) {
      out += "\n\n";
      in_paragraph = 0;
    } else {
      out += ' ';
    }
  }
  return out;
}

}  // namespace spillway::examples
