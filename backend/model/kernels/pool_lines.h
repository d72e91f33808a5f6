// The cache lines of the pool rows a decode step's next attention reads, walked one line at a time, so that a kernel
// running before it (decode_layers.cpp: the MLP's proj GEMV) can ask for them a line at a time among its own work.
//
// Why: a 125M Llama's decode attention at batch 16 reads its 3.1 MB of K/V rows a layer at ~20 GB/s (they lie in
// 32-row blocks over the pool, and one core keeps only so many lines in flight): 1.9-2.0 ms of a 9.4 ms step, 0.7 ms
// on rows already in the caches. proj's GEMV, mostly products over strips in L2, leaves room on the memory bus: with
// the next layer's rows asked for there, a timed build measured the attention at 1.2-1.4 ms and proj ~0.4 ms longer,
// and the whole step took 0.944-0.973x its time (perf/ISSUE16.md, "The next layer's K/V rows asked for during proj").
#pragma once
#include <algorithm>
#include <cstdint>

// Where the rows are: paged_decode's arguments for one layer, as raw pointers (decode_layers.cpp checks the
// tensors' types and contiguity).
struct PoolRowsAhead {
  const int64_t* slots = nullptr;  // (B, L): the pool row of each context column
  int64_t B = 0, L = 0;
  const int64_t* col_start = nullptr;  // (B,): the columns [start, end) each sequence attends to
  const int64_t* col_end = nullptr;
  const char* k = nullptr;  // the two pools' first bytes
  const char* v = nullptr;
  int64_t row_bytes = 0;  // one pool row: KV heads x head size x the element's size
};

// Sequences [first, last) of a PoolRowsAhead in the order the attention reads them: each sequence's K rows, then its
// V rows, every line each row touches. Column ranges are clamped to [0, L) (the attention refuses bad ones later;
// this walk must not read outside slots before it does); a slot outside the pool gives an address outside it, which
// a prefetch ignores (it never faults) and nothing here reads.
class PoolLines {
 public:
  PoolLines() = default;
  PoolLines(const PoolRowsAhead& rows, int64_t first, int64_t last)
      : r_(&rows), b_(first), last_(std::min(last, rows.B)) {
    start_sequence();
  }
  bool done() const { return r_ == nullptr || b_ >= last_; }
  // Whether the line next() gives next is a V row's (else a K row's).
  bool at_v() const { return pool_ == r_->v && pool_ != r_->k; }
  // The next line's address (done() must be false).
  const char* next() {
    const char* at = line_;
    line_ += 64;
    if (line_ >= row_end_) advance_row();
    return at;
  }

 private:
  void start_sequence() {
    for (; b_ < last_; ++b_) {
      c_ = std::max<int64_t>(0, r_->col_start[b_]);
      end_ = std::min(r_->L, r_->col_end[b_]);
      if (c_ < end_) {
        pool_ = r_->k;
        start_row();
        return;
      }
    }
  }
  void start_row() {
    const char* row = pool_ + r_->slots[b_ * r_->L + c_] * r_->row_bytes;
    line_ = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63});
    row_end_ = row + r_->row_bytes;
  }
  void advance_row() {
    if (++c_ < end_) return start_row();
    if (pool_ == r_->k) {  // this sequence's V rows after its K rows
      pool_ = r_->v;
      c_ = std::max<int64_t>(0, r_->col_start[b_]);
      return start_row();
    }
    ++b_;
    start_sequence();
  }

  const PoolRowsAhead* r_ = nullptr;
  int64_t b_ = 0, last_ = 0, c_ = 0, end_ = 0;
  const char* pool_ = nullptr;
  const char* line_ = nullptr;
  const char* row_end_ = nullptr;
};
