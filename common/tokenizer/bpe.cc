#include "common/tokenizer/bpe.h"

#include <climits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/utf8.h"

namespace specd::tok {

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(const Vocab& vocab,
                                                           bool ignore_merges) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  // Bytes without a token are dropped, as HF's BPE does without an unk token, unless the
  // vocabulary has a real unknown token: an unk id that is a control token (SmolLM2 points it at
  // <|endoftext|>) would inject an end-of-text marker into the prompt.
  if (vocab.unk_id >= 0 && vocab.type(vocab.unk_id) == TokenType::kUnknown) {
    m->unk_id_ = vocab.unk_id;
  }
  m->ignore_merges_ = ignore_merges;
  // Merge operands and results are looked up among all tokens except added/special ones, whose
  // text is raw (not byte-mapped) and never the product of merging.
  absl::flat_hash_map<std::string_view, int32_t> ids;
  ids.reserve(vocab.tokens.size());
  for (int32_t i = 0; i < vocab.size(); ++i) {
    const TokenType t = vocab.type(i);
    if (t == TokenType::kControl || t == TokenType::kUserDefined) continue;
    ids.emplace(vocab.tokens[i], i);  // first occurrence wins on duplicates
  }
  for (int b = 0; b < 256; ++b) {
    auto it = ids.find(EncodeUtf8(ByteToCodePoint(static_cast<uint8_t>(b))));
    m->byte_ids_[b] = it == ids.end() ? -1 : it->second;
  }
  m->merges_.reserve(vocab.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    const size_t sp = merge.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= merge.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.ggml.merges[", rank, "] = \"", merge, "\" is not of the form \"left right\""));
    }
    const std::string_view left(merge.data(), sp), right(merge.data() + sp + 1,
                                                         merge.size() - sp - 1);
    auto l = ids.find(left), r = ids.find(right);
    joined.assign(left);
    joined.append(right);
    auto j = ids.find(joined);
    // A merge naming unknown tokens can never fire; skip it rather than fail the whole model.
    if (l == ids.end() || r == ids.end() || j == ids.end()) continue;
    m->merges_.try_emplace(PairKey(l->second, r->second),
                           Merge{static_cast<int32_t>(rank), j->second});
  }
  if (ignore_merges) {
    for (const auto& [text, id] : ids) m->normal_ids_.emplace(text, id);
  }
  return m;
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
    return;
  }
  if (ignore_merges_) {
    auto it = normal_ids_.find(ByteLevelEncode(word));
    if (it != normal_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }

  const int n = static_cast<int>(word.size());
  if (n <= kSmallWord) {
    EncodeSmallWord(word, out);
    return;
  }
  // Symbols form a doubly linked list over the word; id < 0 marks a byte with no token.
  struct Sym {
    int32_t id;
    int prev, next;
  };
  std::vector<Sym> syms(n);
  for (int i = 0; i < n; ++i) {
    syms[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  struct Candidate {
    int32_t rank;
    int left;
    int32_t left_id, right_id;
    // std::priority_queue is a max-heap: "less" means higher rank or further right.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = syms[left].next;
    if (right < 0 || syms[left].id < 0 || syms[right].id < 0) return;
    auto it = merges_.find(PairKey(syms[left].id, syms[right].id));
    if (it != merges_.end()) {
      queue.push({it->second.rank, left, syms[left].id, syms[right].id});
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Sym& l = syms[c.left];
    // Stale entries: the left symbol was absorbed (id -2) or either side changed since.
    if (l.id != c.left_id || l.next < 0 || syms[l.next].id != c.right_id) continue;
    const int right = l.next;
    l.id = merges_.find(PairKey(c.left_id, c.right_id))->second.id;
    l.next = syms[right].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    syms[right].id = -2;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out.push_back(syms[i].id);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }
}

void BpeModel::EncodeSmallWord(std::string_view word, std::vector<int32_t>& out) const {
  // Typical words are a few bytes: keep symbols in a compact array and the rank of each
  // adjacent pair next to it, so each merge costs one scan plus two hash lookups and nothing
  // is allocated.
  constexpr int32_t kNoMerge = INT32_MAX;
  int n = static_cast<int>(word.size());
  int32_t ids[kSmallWord];
  int32_t ranks[kSmallWord];  // ranks[i]: merge rank of (ids[i], ids[i+1])
  int32_t merged[kSmallWord];
  for (int i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
  auto rank_of = [&](int i) {
    if (ids[i] < 0 || ids[i + 1] < 0) return kNoMerge;
    auto it = merges_.find(PairKey(ids[i], ids[i + 1]));
    if (it == merges_.end()) return kNoMerge;
    merged[i] = it->second.id;
    return it->second.rank;
  };
  for (int i = 0; i + 1 < n; ++i) ranks[i] = rank_of(i);
  while (n > 1) {
    int best = -1;
    int32_t best_rank = kNoMerge;
    for (int i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {  // strict: the leftmost of equal ranks wins
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best < 0) break;
    ids[best] = merged[best];
    for (int i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) ranks[best - 1] = rank_of(best - 1);
    if (best + 1 < n) ranks[best] = rank_of(best);
  }
  for (int i = 0; i < n; ++i) {
    if (ids[i] >= 0) {
      out.push_back(ids[i]);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }
}

}  // namespace specd::tok
