#include "common/tokenizer/spm.h"

#include <queue>

#include "common/tokenizer/utf8.h"

namespace specd::tok {

absl::StatusOr<std::unique_ptr<SpmModel>> SpmModel::Create(const Vocab& vocab) {
  std::unique_ptr<SpmModel> m(new SpmModel());
  m->unk_id_ = vocab.unk_id;
  m->scores_ = vocab.scores;
  m->scores_.resize(vocab.tokens.size(), 0.0f);
  m->byte_ids_.fill(-1);
  m->pieces_.reserve(vocab.tokens.size());
  for (int32_t i = 0; i < vocab.size(); ++i) {
    const TokenType t = vocab.type(i);
    if (t == TokenType::kNormal || t == TokenType::kUserDefined) {
      m->pieces_.emplace(vocab.tokens[i], i);
    } else if (t == TokenType::kByte) {
      const int value = ParseByteToken(vocab.tokens[i]);
      if (value >= 0) m->byte_ids_[value] = i;
    }
  }
  return m;
}

void SpmModel::EmitPiece(std::string_view piece, std::vector<int32_t>& out) const {
  auto it = pieces_.find(piece);
  if (it != pieces_.end()) {
    out.push_back(it->second);
    return;
  }
  bool all_bytes = true;
  for (char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
  if (all_bytes) {
    for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  } else if (unk_id_ >= 0) {
    out.push_back(unk_id_);
  }
}

void SpmModel::Encode(std::string_view text, bool add_prefix, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string norm;
  norm.reserve(text.size() + 8);
  if (add_prefix) norm.append(kSpmSpace);
  for (char c : text) {
    if (c == ' ') {
      norm.append(kSpmSpace);
    } else {
      norm.push_back(c);
    }
  }

  // One symbol per code point, linked so merges are O(1).
  struct Sym {
    uint32_t start, len;
    int prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(norm.size());
  for (size_t pos = 0; pos < norm.size();) {
    const int len = Utf8SequenceLength(norm, pos);
    const uint32_t n = len > 0 ? static_cast<uint32_t>(len) : 1;
    const int idx = static_cast<int>(syms.size());
    syms.push_back({static_cast<uint32_t>(pos), n, idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
    pos += n;
  }

  struct Candidate {
    float score;
    int left;
    uint32_t size;  // combined byte length; a mismatch later means the entry is stale
    bool operator<(const Candidate& o) const {  // max-heap: best score, then leftmost
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = syms[left].next;
    if (right < 0) return;
    const std::string_view piece(norm.data() + syms[left].start,
                                 syms[left].len + syms[right].len);
    auto it = pieces_.find(piece);
    if (it == pieces_.end()) return;
    queue.push({scores_[it->second], left, static_cast<uint32_t>(piece.size())});
  };
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Sym& l = syms[c.left];
    if (l.len == 0 || l.next < 0 || l.len + syms[l.next].len != c.size) continue;
    const int right = l.next;
    l.len += syms[right].len;
    syms[right].len = 0;
    l.next = syms[right].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = syms[i].next) {
    EmitPiece(std::string_view(norm.data() + syms[i].start, syms[i].len), out);
  }
}

}  // namespace specd::tok
