// The planning engine's hot path in C++: the memory-aware list scheduler and the event simulator.
//
// This file ports the readable Python reference in pipeline/list_scheduler.py and
// pipeline/simulator.py (read those first): the simulator line for line, the list scheduler with
// the same decisions kept incrementally (see ListScheduler). Every floating-point operation happens
// in the same order as there, so both give bit-identical times, orders and memory peaks; tests/
// pipeline/test_engine_differential.py proves it on generated cases. Build: python -m pipeline._native.build.
//
// Data crosses the boundary as flat arrays: per-stage costs as float64 vectors, the schedule as an
// (N, 3) int32 array of (stage, op, micro-batch) rows with per-device offsets; op codes are
// F=0, I=1, W=2, B=3.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int OP_F = 0, OP_I = 1, OP_W = 2, OP_B = 3;
constexpr double INF = std::numeric_limits<double>::infinity();
// A batch with fewer actions than this runs on the calling thread alone (see schedule_and_simulate_batch).
constexpr long long SMALL_BATCH_ACTIONS = 2000;

using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

struct StageCosts {
  std::vector<double> f, i, w, act, keep, comm, backward;
};

struct ListConfig {
  std::vector<double> caps;  // empty: unlimited
  bool split = true;
  bool eager = false;
  bool depth = true;
  long long max_pending_w = -1;  // -1: none
  bool count_w = true;
};

struct Order {
  std::vector<int32_t> rows;     // 3 ints per action: stage, op, micro-batch
  std::vector<int64_t> offsets;  // devices + 1
  std::string error;             // non-empty: the scheduler got stuck
};

// ------------------------------------------------------------------ list scheduler

// One device's best next action: start time, priority (backward 0, forward 1, deferred W 2, or 0
// once max_pending_w wait), stage, kind (0 forward, 1 backward: I or B, 2 deferred W).
struct Choice {
  double start;
  int prio;
  int stage;
  int kind;
};

constexpr Choice NO_CHOICE{INF, 9, -1, -1};

bool tuple_less(int p1, int s1, int k1, int p2, int s2, int k2) {
  return std::tie(p1, s1, k1) < std::tie(p2, s2, k2);
}

// The list scheduler of pipeline/list_scheduler.py, structured for its hot loop. Per step it picks
// the device whose cached best action starts earliest (lowest index on ties) and runs that action;
// only the (at most two) devices the action touched get a new best action. The reference (and the
// scan this replaced) paid per step a pass over every device plus a pass over each touched
// device's stages gathering from the (stage, micro-batch) tables; profiled on the tuner's jobs,
// that was ~85% of a schedule-and-simulate job, the simulation the rest. What is incremental:
//
// * Ready times per stage. `bready[j]` / `fready[j]` hold when the next backward / forward of the
//   stage in slot j may start (-1: none is ready). They depend only on that stage's counters and
//   on the end times its neighbours wrote, so an action refreshes just the slots it changed (F at s:
//   s's two and s+1's forward; I/B at s: s's backward and s-1's backward), with the very expressions
//   the reference evaluates in best(). best(d) then reads one contiguous run of slots (device after
//   device, in the order the reference scans them) instead of gathering from the (stage,
//   micro-batch) tables.
// * The earliest device: a tournament tree over the devices' cached starts (winner: lower start,
//   lower index on ties, as the reference's heap of (start, device) pops). Refreshing a device
//   walks one leaf-to-root path, log2(devices) steps, instead of scanning every device per step.
// * The neighbour device (the one whose stage the action fed) keeps its cached best action when
//   the action cannot have changed it (stale(): a new candidate that starts strictly later), so
//   it needs neither best() nor a tree walk.
// * No allocation per step: the deferred W's of each device wait in its own span of one array (a
//   device queues at most stages x micro-batches of them), and the order is written straight into
//   the output rows at per-device cursors (each device's action count is known up front).
//
// Every floating-point operation is the reference's, on the same values, in the same order: the
// results are bit-identical (tests/pipeline/test_engine_differential.py).
class ListScheduler {
 public:
  ListScheduler(const StageCosts& c, const std::vector<int>& placement, int devices, int M, const ListConfig& cfg)
      : c_(c), placement_(placement), D_(devices), M_(M), S_(static_cast<int>(placement.size())), last_(S_ - 1),
        split_(cfg.split), eager_(cfg.eager), count_w_(cfg.count_w),
        max_w_(cfg.max_pending_w >= 0 ? cfg.max_pending_w : (1LL << 30)) {
    const int S = S_;
    // Slots: the stages of each device, in the order the reference scans them (depth-first: later
    // stage first), device after device.
    std::vector<std::vector<int>> stages_of(D_);
    for (int s = 0; s < S; ++s) stages_of[placement[s]].push_back(s);
    if (cfg.depth)
      for (auto& lst : stages_of) std::reverse(lst.begin(), lst.end());
    first_slot_.assign(D_ + 1, 0);
    slot_stage_.reserve(S);
    slot_of_.assign(S, 0);
    for (int d = 0; d < D_; ++d) {
      for (int s : stages_of[d]) {
        slot_of_[s] = static_cast<int>(slot_stage_.size());
        slot_stage_.push_back(s);
      }
      first_slot_[d + 1] = static_cast<int>(slot_stage_.size());
    }
    // A forward admits a micro-batch to the rest of the device's stages: it needs room for all.
    need_.assign(S, 0.0);
    for (int s = 0; s < S; ++s) {
      double acc = 0.0;
      for (int x = s; x < S; ++x)
        if (placement[x] == placement[s]) acc += c.act[x];
      need_[slot_of_[s]] = acc;
    }
    std::vector<double> caps = cfg.caps;
    if (caps.empty()) caps.assign(D_, INF);
    cap_tol_.resize(D_);
    for (int d = 0; d < D_; ++d) cap_tol_[d] = caps[d] * (1 + 1e-9);
    fend_.assign(static_cast<size_t>(S) * M, -1.0);
    iend_.assign(static_cast<size_t>(S) * M, -1.0);
    nf_.assign(S, 0);
    nb_.assign(S, 0);
    bready_.assign(S, -1.0);
    fready_.assign(S, -1.0);
    free_at_.assign(D_, 0.0);
    mem_.assign(D_, 0.0);
    remaining_.resize(D_);
    const int per = split_ ? 3 : 2;
    out_.offsets.assign(D_ + 1, 0);
    wq_base_.assign(D_, 0);
    size_t wq_size = 0;
    for (int d = 0; d < D_; ++d) {
      const long long n_stages = first_slot_[d + 1] - first_slot_[d];
      remaining_[d] = n_stages * M * per;
      total_ += remaining_[d];
      out_.offsets[d + 1] = out_.offsets[d] + remaining_[d];
      wq_base_[d] = wq_size;
      wq_size += static_cast<size_t>(n_stages) * M;
    }
    wq_.resize(split_ && !eager_ ? wq_size : 0);
    wq_head_ = wq_base_;
    wq_tail_ = wq_base_;
    out_.rows.resize(static_cast<size_t>(total_) * 3);
    cursor_.resize(D_);
    for (int d = 0; d < D_; ++d) cursor_[d] = static_cast<size_t>(out_.offsets[d]) * 3;
    for (int s = 0; s < S; ++s) {
      refresh_forward(s);
      refresh_backward(s);
    }
    leaves_ = 1;
    while (leaves_ < D_) leaves_ *= 2;
    cache_.assign(D_, NO_CHOICE);
    tree_.assign(2 * static_cast<size_t>(leaves_), Entry{});
    for (int i = 0; i < leaves_; ++i) tree_[leaves_ + i] = entry(INF, i);  // padding never wins a tie
    for (int d = 0; d < D_; ++d) tree_[leaves_ + d] = leaf(d);
    for (int i = leaves_ - 1; i >= 1; --i) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  }

  Order run() {
    long long done = 0;
    while (done < total_) {
      int pick_d = device_of(tree_[1]);
      Choice pick = tree_[1] < NONE_ ? cache_[pick_d] : NO_CHOICE;
      if (pick.start == INF) {
        // Every device waits on its memory cap: let the earliest forward through.
        pick_d = -1;
        for (int d = 0; d < D_; ++d) {
          if (remaining_[d]) {
            const Choice ch = best(d, true);
            if (pick_d < 0 || ch.start < pick.start) {
              pick = ch;
              pick_d = d;
            }
          }
        }
        if (pick_d < 0 || pick.start == INF) {
          out_.error = "list scheduler is stuck; the placement may not form a pipeline";
          return std::move(out_);
        }
      }
      const int d = pick_d;
      const double start = pick.start;
      int s = pick.stage;
      int other = -1;                        // the neighbour stage's device, if any
      double before = -1.0, after = -1.0;    // its slot's ready time before and after this action
      double end;
      if (pick.kind == 0) {
        const int m = nf_[s]++;
        end = start + c_.f[s];
        fend_[static_cast<size_t>(s) * M_ + m] = end;
        mem_[d] += c_.act[s];
        emit(d, s, OP_F, m);
        refresh_forward(s);
        refresh_backward(s);
        if (s < last_) {
          before = fready_[slot_of_[s + 1]];
          refresh_forward(s + 1);
          after = fready_[slot_of_[s + 1]];
          other = placement_[s + 1];
        }
      } else if (pick.kind == 1) {
        const int m = nb_[s]++;
        if (split_) {
          end = start + c_.i[s];
          mem_[d] -= count_w_ ? c_.act[s] - c_.keep[s] : c_.act[s];
          emit(d, s, OP_I, m);
          if (eager_) {
            end += c_.w[s];
            if (count_w_) mem_[d] -= c_.keep[s];
            emit(d, s, OP_W, m);
            remaining_[d] -= 1;
            done += 1;
          } else {
            wq_[wq_tail_[d]++] = {s, m};
          }
        } else {
          end = start + c_.backward[s];
          mem_[d] -= c_.act[s];
          emit(d, s, OP_B, m);
        }
        iend_[static_cast<size_t>(s) * M_ + m] = (split_ && eager_) ? end - c_.w[s] : end;
        refresh_backward(s);
        if (s > 0) {
          before = bready_[slot_of_[s - 1]];
          refresh_backward(s - 1);
          after = bready_[slot_of_[s - 1]];
          other = placement_[s - 1];
        }
      } else {
        const auto [ws, wm] = wq_[wq_head_[d]++];
        s = ws;
        end = start + c_.w[s];
        if (count_w_) mem_[d] -= c_.keep[s];
        emit(d, s, OP_W, wm);
      }
      free_at_[d] = end;
      remaining_[d] -= 1;
      done += 1;
      touch(d);
      // The reference recomputes both devices ({d, other}); where the other's best action cannot
      // have changed, its cached one is that result already.
      if (other >= 0 && other != d && stale(other, before, after)) touch(other);
    }
    return std::move(out_);
  }

 private:
  // When stage s's next backward may start, as the reference's best() computes it (-1: none ready).
  void refresh_backward(int s) {
    const int m = nb_[s];
    double ready = -1.0;
    if (m < nf_[s]) {
      const double fe = fend_[static_cast<size_t>(s) * M_ + m];
      if (s == last_) {
        ready = fe;
      } else {
        const double g = iend_[static_cast<size_t>(s + 1) * M_ + m];
        ready = g < 0 ? -1.0 : (fe > g + c_.comm[s] ? fe : g + c_.comm[s]);
      }
    }
    bready_[slot_of_[s]] = ready;
  }

  // When stage s's next forward may start (-1: none ready or none left).
  void refresh_forward(int s) {
    const int m = nf_[s];
    double ready = -1.0;
    if (m < M_) {
      if (s == 0) {
        ready = 0.0;
      } else {
        const double pe = fend_[static_cast<size_t>(s - 1) * M_ + m];
        ready = pe < 0 ? -1.0 : pe + c_.comm[s - 1];
      }
    }
    fready_[slot_of_[s]] = ready;
  }

  // Device d's best next action (the reference's best(d, force)): the earliest-starting candidate
  // wins; among those that can start then, the lowest (priority, stage, kind).
  Choice best(int d, bool force) const {
    const double t = free_at_[d];
    double b_st = INF, f_st = INF;
    int b_j = -1, f_j = -1;
    const double room = cap_tol_[d] - mem_[d];
    const bool empty = mem_[d] < 1.0;
    for (int j = first_slot_[d], end = first_slot_[d + 1]; j < end; ++j) {
      const double br = bready_[j];
      if (br >= 0) {
        const double st = br > t ? br : t;
        if (st < b_st) {
          b_st = st;
          b_j = j;
        }
      }
      const double fr = fready_[j];
      if (fr >= 0 && (force || need_[j] <= room || empty)) {
        const double st = fr > t ? fr : t;
        if (st < f_st) {
          f_st = st;
          f_j = j;
        }
      }
    }
    const size_t queued = wq_tail_[d] - wq_head_[d];
    const double w_st = queued ? t : INF;
    const double start = std::min(std::min(b_st, f_st), w_st);
    Choice choice = NO_CHOICE;
    if (start == INF) return choice;
    if (b_st <= start) choice = Choice{b_st, 0, slot_stage_[b_j], 1};
    if (f_st <= start && tuple_less(1, slot_stage_[f_j], 0, choice.prio, choice.stage, choice.kind))
      choice = Choice{f_st, 1, slot_stage_[f_j], 0};
    if (w_st <= start) {
      const int w_prio = static_cast<long long>(queued) < max_w_ ? 2 : 0;
      const int w_stage = wq_[wq_head_[d]].first;
      if (tuple_less(w_prio, w_stage, 2, choice.prio, choice.stage, choice.kind))
        choice = Choice{w_st, w_prio, w_stage, 2};
    }
    return choice;
  }

  // Whether device e's cached best action may differ from best(e, false) now that one of its
  // slots' ready times went from `before` to `after` (nothing else of e changed). Not when the
  // slot is as it was, nor when a slot with no candidate gains one that starts strictly after the
  // cached choice: the earliest start stays, and so do the candidates that start then (a later
  // one cannot tie). Any other change (a candidate lost or moved, NaN) recomputes.
  bool stale(int e, double before, double after) const {
    if (before == after) return false;
    if (before >= 0) return true;
    if (!(after >= 0)) return false;
    const double t = free_at_[e];
    const double st = after > t ? after : t;
    return !(st > cache_[e].start);
  }

  // A tree entry: (start, device) packed into one integer whose order is the pick's order: the
  // start's bits mapped so that unsigned order is the doubles' order, then the device (lower wins
  // ties). One compare and a conditional move per tree level, no branch to mispredict.
#ifdef __SIZEOF_INT128__
  using Entry = unsigned __int128;
  static Entry pack(uint64_t bits, int d) { return (static_cast<Entry>(bits) << 32) | static_cast<uint32_t>(d); }
  static int device_of(Entry e) { return static_cast<int>(static_cast<uint32_t>(e)); }
#else  // the same order, compared as a pair where the compiler has no 128-bit integers
  using Entry = std::pair<uint64_t, uint32_t>;
  static Entry pack(uint64_t bits, int d) { return {bits, static_cast<uint32_t>(d)}; }
  static int device_of(Entry e) { return static_cast<int>(e.second); }
#endif

  static Entry entry(double start, int d) {
    if (!(start == start)) start = INF;  // the reference never picks a NaN start: as if none
    start += 0.0;                        // -0 ties with +0, as under the reference's `<`
    uint64_t bits;
    std::memcpy(&bits, &start, sizeof bits);
    bits ^= (bits >> 63) ? ~uint64_t{0} : (uint64_t{1} << 63);
    return pack(bits, d);
  }

  // Cache device d's best action; its entry holds that start, INF when it has nothing left.
  Entry leaf(int d) {
    if (!remaining_[d]) return entry(INF, d);
    cache_[d] = best(d, false);
    return entry(cache_[d].start, d);
  }

  // Refresh device d's best action and its leaf-to-root path.
  void touch(int d) {
    size_t i = static_cast<size_t>(leaves_) + d;
    Entry cur = leaf(d);
    tree_[i] = cur;
    for (; i > 1; i >>= 1) {
      const Entry sib = tree_[i ^ 1];
      cur = sib < cur ? sib : cur;
      tree_[i >> 1] = cur;
    }
  }

  void emit(int d, int stage, int op, int m) {
    int32_t* row = out_.rows.data() + cursor_[d];
    row[0] = stage;
    row[1] = op;
    row[2] = m;
    cursor_[d] += 3;
  }

  const StageCosts& c_;
  const std::vector<int>& placement_;
  const int D_, M_, S_, last_;
  const bool split_, eager_, count_w_;
  const long long max_w_;
  const Entry NONE_ = entry(INF, 0);  // an entry below it has a finite start
  long long total_ = 0;
  std::vector<int> first_slot_, slot_stage_, slot_of_;  // device -> slots; slot -> stage; stage -> slot
  std::vector<double> need_, bready_, fready_;          // per slot
  std::vector<double> cap_tol_, free_at_, mem_;         // per device
  std::vector<long long> remaining_;                    // per device: actions left
  std::vector<double> fend_, iend_;                     // per (stage, micro-batch): end times, -1 not yet
  std::vector<int> nf_, nb_;                            // per stage: forwards / backwards run
  std::vector<std::pair<int, int>> wq_;                 // deferred W's (stage, micro-batch), per-device spans
  std::vector<size_t> wq_base_, wq_head_, wq_tail_;
  std::vector<Choice> cache_;                           // per device: its best action
  int leaves_ = 1;
  std::vector<Entry> tree_;                             // tournament tree: node -> winning (start, device)
  std::vector<size_t> cursor_;                          // per device: next row in out_.rows (x3)
  Order out_;
};

Order list_schedule(const StageCosts& c, const std::vector<int>& placement, int devices, int M,
                    const ListConfig& cfg) {
  return ListScheduler(c, placement, devices, M, cfg).run();
}

// ------------------------------------------------------------------ simulator

struct SimOut {
  bool ok = true;
  double makespan = 0.0;
  std::vector<double> busy, peak;
  std::vector<int64_t> ptr;            // per device: actions run (all of them when ok)
  std::vector<double> starts, ends;    // per action in schedule order, when recorded
};

SimOut simulate(const StageCosts& c, int devices, int M, const int32_t* rows, const int64_t* offsets,
                bool record) {
  const int S = static_cast<int>(c.f.size());
  const int last = S - 1;
  const size_t n = static_cast<size_t>(S) * M;
  std::vector<double> fend(n, NAN), iend(n, NAN);
  std::vector<char> fdone(n, 0), idone(n, 0);
  SimOut out;
  out.ptr.assign(devices, 0);
  out.busy.assign(devices, 0.0);
  out.peak.assign(devices, 0.0);
  std::vector<double> free_at(devices, 0.0), mem(devices, 0.0);
  const int64_t total = offsets[devices];
  if (record) {
    out.starts.assign(total, 0.0);
    out.ends.assign(total, 0.0);
  }
  int64_t done = 0;
  bool progress = true;
  while (progress && done < total) {
    progress = false;
    for (int d = 0; d < devices; ++d) {
      int64_t k = offsets[d] + out.ptr[d];
      const int64_t end_k = offsets[d + 1];
      if (k >= end_k) continue;
      const int64_t k0 = k;
      double t = free_at[d], cur = mem[d], pk = out.peak[d], bz = out.busy[d];
      while (k < end_k) {
        const int s = rows[3 * k], op = rows[3 * k + 1], m = rows[3 * k + 2];
        const size_t idx = static_cast<size_t>(s) * M + m;
        double start, dur;
        if (op == OP_F) {
          if (s) {
            if (!fdone[idx - M]) break;
            const double ready = fend[idx - M] + c.comm[s - 1];
            start = ready > t ? ready : t;
          } else {
            start = t;
          }
          dur = c.f[s];
          t = start + dur;
          fend[idx] = t;
          fdone[idx] = 1;
          cur += c.act[s];
          if (cur > pk) pk = cur;
        } else if (op == OP_W) {
          if (!idone[idx]) break;
          start = t;
          dur = c.w[s];
          t = start + dur;
          cur -= c.keep[s];
        } else {  // I or B
          if (!fdone[idx]) break;
          const double f_done = fend[idx];
          double ready;
          if (s != last) {
            if (!idone[idx + M]) break;
            ready = iend[idx + M] + c.comm[s];
            if (f_done > ready) ready = f_done;
          } else {
            ready = f_done;
          }
          start = ready > t ? ready : t;
          if (op == OP_I) {
            dur = c.i[s];
            cur -= c.act[s] - c.keep[s];
            if (cur > pk) pk = cur;  // PyTorch's I can keep more than F added (gradients for W)
          } else {
            dur = c.backward[s];
            cur -= c.act[s];
          }
          t = start + dur;
          iend[idx] = t;
          idone[idx] = 1;
        }
        bz += dur;
        if (record) {
          out.starts[k] = start;
          out.ends[k] = t;
        }
        ++k;
      }
      if (k != k0) {
        done += k - k0;
        out.ptr[d] = k - offsets[d];
        free_at[d] = t;
        mem[d] = cur;
        out.peak[d] = pk;
        out.busy[d] = bz;
        progress = true;
      }
    }
  }
  out.ok = done >= total;
  double makespan = 0.0;
  for (int d = 0; d < devices; ++d) makespan = d == 0 ? free_at[d] : std::max(makespan, free_at[d]);
  out.makespan = makespan;
  return out;
}

// ------------------------------------------------------------------ validation

// The first problem validate_plan's schedule checks would report, as (kind, data) with the same
// precedence as the Python reference: per-action checks in schedule order, then missing actions.
// kind: "" none, "stage", "mb", "device", "twice", "both", "missing".
std::pair<std::string, std::vector<int64_t>> check_schedule(int devices, int M, const std::vector<int>& placement,
                                                            const int32_t* rows, const int64_t* offsets) {
  const int S = static_cast<int>(placement.size());
  const size_t n = static_cast<size_t>(S) * M * 4;
  // Device that ran each (stage, micro-batch, op); dense when that table is small, hashed when a
  // typo like 10^9 micro-batches makes it huge (the actions are few then).
  const bool dense = n <= (size_t{1} << 26);
  std::vector<int32_t> table(dense ? n : 0, -1);
  std::unordered_map<size_t, int32_t> sparse;
  auto lookup = [&](size_t key) -> int32_t {
    if (dense) return table[key];
    auto it = sparse.find(key);
    return it == sparse.end() ? -1 : it->second;
  };
  for (int d = 0; d < devices; ++d) {
    for (int64_t k = offsets[d]; k < offsets[d + 1]; ++k) {
      const int s = rows[3 * k], op = rows[3 * k + 1], m = rows[3 * k + 2];
      if (s < 0 || s >= S) return {"stage", {d, k}};
      if (m < 0 || m >= M) return {"mb", {d, k}};
      if (placement[s] != d) return {"device", {d, k}};
      const size_t key = (static_cast<size_t>(s) * M + m) * 4 + op;
      const int32_t first = lookup(key);
      if (first >= 0) return {"twice", {d, k, first}};
      if (dense) table[key] = d; else sparse[key] = d;
    }
  }
  std::vector<int64_t> missing;  // (stage, op, mb) triples
  for (int s = 0; s < S; ++s) {
    for (int m = 0; m < M; ++m) {
      if (missing.size() / 3 > 8) break;
      const size_t base = (static_cast<size_t>(s) * M + m) * 4;
      if (lookup(base + OP_F) < 0) missing.insert(missing.end(), {s, OP_F, m});
      const bool has_b = lookup(base + OP_B) >= 0, has_i = lookup(base + OP_I) >= 0, has_w = lookup(base + OP_W) >= 0;
      if (has_b && (has_i || has_w)) return {"both", {s, m, has_i ? OP_I : OP_W}};
      if (!has_b) {
        if (!has_i) missing.insert(missing.end(), {s, has_w ? OP_I : OP_B, m});
        if (has_i && !has_w) missing.insert(missing.end(), {s, OP_W, m});
      }
    }
    if (missing.size() / 3 > 8) break;
  }
  if (!missing.empty()) return {"missing", missing};
  return {"", {}};
}

// ------------------------------------------------------------------ batch threads

// Helper threads for schedule_and_simulate_batch, started once and kept (starting std::threads at
// every batch cost ~15-20 us, as much as a small job). run(helpers, work) runs `work` on the calling
// thread and on up to `helpers` pool threads, and returns once every one of them is out of it. One
// batch at a time: a second caller (another Python thread; the GIL is released) runs inline, and so
// does a child after fork() (its pool threads do not exist there; it makes a pool of its own).
class BatchPool {
 public:
  static BatchPool& get() {
    static BatchPool* pool = nullptr;  // never destroyed: idle threads die with the process
    static pid_t owner = 0;
    static std::mutex guard;
    std::lock_guard<std::mutex> lk(guard);
    if (pool == nullptr || owner != getpid()) {
      pool = new BatchPool();  // after fork() the parent's pool (and its locks) are left alone
      owner = getpid();
    }
    return *pool;
  }

  void run(int helpers, const std::function<void()>& work) {
    std::unique_lock<std::mutex> batch(batch_mu_, std::try_to_lock);
    if (!batch.owns_lock() || helpers <= 0) {
      work();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      try {
        while (static_cast<int>(threads_.size()) < helpers)
          threads_.emplace_back([this, g = generation_] { loop(g); });
      } catch (const std::system_error&) {  // no more threads: fewer helpers
      }
      work_ = &work;
      wanted_ = std::min<int>(helpers, static_cast<int>(threads_.size()));
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr failed;
    try {
      work();
    } catch (...) {
      failed = std::current_exception();
    }
    {
      std::unique_lock<std::mutex> lk(mu_);
      wanted_ = 0;  // a helper that wakes late stays out
      idle_.wait(lk, [this] { return running_ == 0; });
      work_ = nullptr;
      if (!failed) failed = failed_;
      failed_ = nullptr;
    }
    if (failed) std::rethrow_exception(failed);
  }

 private:
  void loop(unsigned long long seen) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      wake_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (wanted_ <= 0) continue;
      --wanted_;
      ++running_;
      const std::function<void()>* work = work_;
      lk.unlock();
      std::exception_ptr failed;
      try {
        (*work)();
      } catch (...) {
        failed = std::current_exception();
      }
      lk.lock();
      if (failed && !failed_) failed_ = failed;
      if (--running_ == 0) idle_.notify_all();
    }
  }

  std::mutex batch_mu_;  // held for a whole batch
  std::mutex mu_;        // guards the fields below
  std::condition_variable wake_, idle_;
  std::vector<std::thread> threads_;
  const std::function<void()>* work_ = nullptr;
  unsigned long long generation_ = 0;
  int wanted_ = 0;   // helpers still to join the current batch
  int running_ = 0;  // helpers inside it
  std::exception_ptr failed_;  // what a helper threw (the caller rethrows it)
};

// ------------------------------------------------------------------ Python bindings

StageCosts costs_from(const std::vector<double>& f, const std::vector<double>& i, const std::vector<double>& w,
                      const std::vector<double>& act, const std::vector<double>& keep,
                      const std::vector<double>& comm, const std::vector<double>& backward) {
  const size_t S = f.size();
  if (i.size() != S || w.size() != S || act.size() != S || keep.size() != S || comm.size() != S ||
      backward.size() != S)
    throw std::invalid_argument("stage cost vectors must all have one entry per stage");
  return StageCosts{f, i, w, act, keep, comm, backward};
}

ListConfig config_from(const std::vector<double>& caps, bool split, bool eager, bool depth, long long max_pending_w,
                       bool count_w) {
  return ListConfig{caps, split, eager, depth, max_pending_w, count_w};
}

void check_rows(const IntArray& rows, const std::vector<int64_t>& offsets, int devices) {
  if (static_cast<int>(offsets.size()) != devices + 1)
    throw std::invalid_argument("offsets must have devices + 1 entries");
  if (rows.ndim() != 2 || rows.shape(1) != 3 || rows.shape(0) != offsets.back())
    throw std::invalid_argument("rows must be an (N, 3) array with N = offsets[-1]");
}

py::tuple order_tuple(Order&& o) {
  if (!o.error.empty()) throw std::runtime_error(o.error);
  const py::ssize_t n = static_cast<py::ssize_t>(o.rows.size() / 3);
  IntArray rows({n, static_cast<py::ssize_t>(3)});
  std::copy(o.rows.begin(), o.rows.end(), rows.mutable_data());
  return py::make_tuple(rows, o.offsets);
}

py::tuple sim_tuple(SimOut&& r, bool record) {
  py::object starts = py::none(), ends = py::none();
  if (record) {
    starts = py::array_t<double>(static_cast<py::ssize_t>(r.starts.size()), r.starts.data());
    ends = py::array_t<double>(static_cast<py::ssize_t>(r.ends.size()), r.ends.data());
  }
  return py::make_tuple(r.ok, r.makespan, r.busy, r.peak, r.ptr, starts, ends);
}

// The batched environment's native core (env/vector_env.py): see env_core.hpp.
#include "env_core.hpp"

}  // namespace

PYBIND11_MODULE(_engine, mod) {
  mod.doc() = "Compiled list scheduler and event simulator (see pipeline/_native/engine.cpp).";
  mod.attr("ABI") = 1;
  bind_env_core(mod);

  mod.def(
      "list_schedule",
      [](const std::vector<double>& f, const std::vector<double>& i, const std::vector<double>& w,
         const std::vector<double>& act, const std::vector<double>& keep, const std::vector<double>& comm,
         const std::vector<double>& backward, const std::vector<int>& placement, int devices, int microbatches,
         const std::vector<double>& caps, bool split, bool eager, bool depth, long long max_pending_w,
         bool count_w) {
        StageCosts c = costs_from(f, i, w, act, keep, comm, backward);
        ListConfig cfg = config_from(caps, split, eager, depth, max_pending_w, count_w);
        Order o;
        {
          py::gil_scoped_release nogil;
          o = list_schedule(c, placement, devices, microbatches, cfg);
        }
        return order_tuple(std::move(o));
      },
      "Per-device orders as ((N, 3) int32 rows of stage, op, micro-batch; device offsets).");

  mod.def(
      "simulate",
      [](const std::vector<double>& f, const std::vector<double>& i, const std::vector<double>& w,
         const std::vector<double>& act, const std::vector<double>& keep, const std::vector<double>& comm,
         const std::vector<double>& backward, int devices, int microbatches, const IntArray& rows,
         const std::vector<int64_t>& offsets, bool record) {
        StageCosts c = costs_from(f, i, w, act, keep, comm, backward);
        check_rows(rows, offsets, devices);
        SimOut r;
        {
          py::gil_scoped_release nogil;
          r = simulate(c, devices, microbatches, rows.data(), offsets.data(), record);
        }
        return sim_tuple(std::move(r), record);
      },
      "(ok, makespan, busy, peak activations, actions run per device, starts, ends).");

  mod.def(
      "schedule_and_simulate",
      [](const std::vector<double>& f, const std::vector<double>& i, const std::vector<double>& w,
         const std::vector<double>& act, const std::vector<double>& keep, const std::vector<double>& comm,
         const std::vector<double>& backward, const std::vector<int>& placement, int devices, int microbatches,
         const std::vector<double>& caps, bool split, bool eager, bool depth, long long max_pending_w,
         bool count_w) {
        StageCosts c = costs_from(f, i, w, act, keep, comm, backward);
        ListConfig cfg = config_from(caps, split, eager, depth, max_pending_w, count_w);
        Order o;
        SimOut r;
        {
          py::gil_scoped_release nogil;
          o = list_schedule(c, placement, devices, microbatches, cfg);
          if (o.error.empty()) r = simulate(c, devices, microbatches, o.rows.data(), o.offsets.data(), false);
        }
        if (!o.error.empty()) throw std::runtime_error(o.error);
        return py::make_tuple(r.ok, r.makespan, r.busy, r.peak);
      },
      "List-schedule and simulate in one call: (ok, makespan, busy, peak activations); no order crosses back.");

  mod.def(
      "schedule_and_simulate_batch",
      [](const py::list& jobs, int threads) {
        // Each job is the argument tuple of schedule_and_simulate; the jobs run on `threads`
        // threads without the GIL. A job that fails comes back as its error message.
        struct Job {
          StageCosts costs;
          std::vector<int> placement;
          int devices = 0, microbatches = 0;
          ListConfig cfg;
          Order order;
          SimOut sim;
        };
        std::vector<Job> work(jobs.size());
        for (size_t k = 0; k < work.size(); ++k) {
          const py::tuple a = jobs[k].cast<py::tuple>();
          if (a.size() != 16) throw std::invalid_argument("each job needs schedule_and_simulate's 16 arguments");
          auto vec = [&](int i) { return a[i].cast<std::vector<double>>(); };
          Job& j = work[k];
          j.costs = costs_from(vec(0), vec(1), vec(2), vec(3), vec(4), vec(5), vec(6));
          j.placement = a[7].cast<std::vector<int>>();
          j.devices = a[8].cast<int>();
          j.microbatches = a[9].cast<int>();
          j.cfg = config_from(vec(10), a[11].cast<bool>(), a[12].cast<bool>(), a[13].cast<bool>(),
                              a[14].cast<long long>(), a[15].cast<bool>());
        }
        {
          py::gil_scoped_release nogil;
          std::atomic<size_t> next{0};
          auto worker = [&]() {
            for (size_t k = next++; k < work.size(); k = next++) {
              Job& j = work[k];
              j.order = list_schedule(j.costs, j.placement, j.devices, j.microbatches, j.cfg);
              if (j.order.error.empty())
                j.sim = simulate(j.costs, j.devices, j.microbatches, j.order.rows.data(), j.order.offsets.data(),
                                 false);
            }
          };
          // Below ~2,000 actions in all (tens of microseconds) a helper's wake-up costs more than it saves.
          long long actions = 0;
          for (const Job& j : work)
            actions += static_cast<long long>(j.placement.size()) * j.microbatches * (j.cfg.split ? 3 : 2);
          int n = std::max(1, std::min<int>(threads, static_cast<int>(work.size())));
          if (actions < SMALL_BATCH_ACTIONS) n = 1;
          const std::function<void()> task = worker;
          BatchPool::get().run(n - 1, task);
        }
        py::list out;
        for (auto& j : work) {
          if (!j.order.error.empty())
            out.append(py::str(j.order.error));
          else
            out.append(py::make_tuple(j.sim.ok, j.sim.makespan, j.sim.busy, j.sim.peak));
        }
        return out;
      },
      "schedule_and_simulate over a list of argument tuples on several threads; an error comes back as its message.");

  mod.def(
      "check_schedule",
      [](int devices, int microbatches, const std::vector<int>& placement, const IntArray& rows,
         const std::vector<int64_t>& offsets) {
        check_rows(rows, offsets, devices);
        for (py::ssize_t k = 0; k < rows.shape(0); ++k) {
          const int op = rows.data()[3 * k + 1];
          if (op < 0 || op > 3) throw std::invalid_argument("op codes are 0..3 (F, I, W, B)");
        }
        return check_schedule(devices, microbatches, placement, rows.data(), offsets.data());
      },
      "The first structural problem of a schedule as (kind, data); kind '' when there is none.");
}
