// The planning engine's hot path in C++: the memory-aware list scheduler and the event simulator.
//
// This file is a line-for-line port of the readable Python reference in pipeline/list_scheduler.py
// and pipeline/simulator.py (read those first). Every floating-point operation happens in the same
// order as there, so both give bit-identical times, orders and memory peaks; tests/pipeline/
// test_engine_differential.py proves it on generated cases. Build: python -m pipeline._native.build.
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
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
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

struct Choice {
  double start;
  int prio;
  int stage;
  int kind;  // 0 forward, 1 backward (I or B), 2 deferred W
};

bool tuple_less(int p1, int s1, int k1, int p2, int s2, int k2) {
  return std::tie(p1, s1, k1) < std::tie(p2, s2, k2);
}

Order list_schedule(const StageCosts& c, const std::vector<int>& placement, int devices, int M,
                    const ListConfig& cfg) {
  const int S = static_cast<int>(placement.size());
  const int last = S - 1;
  std::vector<double> caps = cfg.caps;
  if (caps.empty()) caps.assign(devices, INF);
  std::vector<std::vector<int>> stages_of(devices);
  for (int s = 0; s < S; ++s) stages_of[placement[s]].push_back(s);
  std::vector<double> need(S, 0.0);
  for (int s = 0; s < S; ++s) {
    double acc = 0.0;
    for (int x = s; x < S; ++x)
      if (placement[x] == placement[s]) acc += c.act[x];
    need[s] = acc;
  }
  const long long max_w = cfg.max_pending_w >= 0 ? cfg.max_pending_w : (1LL << 30);
  if (cfg.depth)
    for (auto& lst : stages_of) std::reverse(lst.begin(), lst.end());
  std::vector<double> fend(static_cast<size_t>(S) * M, -1.0), iend(static_cast<size_t>(S) * M, -1.0);
  std::vector<int> nf(S, 0), nb(S, 0);
  std::vector<std::deque<std::pair<int, int>>> wq(devices);
  std::vector<double> free_at(devices, 0.0), mem(devices, 0.0);
  std::vector<std::vector<int32_t>> order(devices);
  std::vector<long long> remaining(devices);
  long long total = 0;
  const int per = cfg.split ? 3 : 2;
  for (int d = 0; d < devices; ++d) {
    remaining[d] = static_cast<long long>(stages_of[d].size()) * M * per;
    total += remaining[d];
    order[d].reserve(static_cast<size_t>(remaining[d]) * 3);
  }
  std::vector<double> cap_tol(devices);
  for (int d = 0; d < devices; ++d) cap_tol[d] = caps[d] * (1 + 1e-9);

  auto best = [&](int d, bool force) -> Choice {
    const double t = free_at[d];
    double b_st = INF, f_st = INF;
    int b_s = -1, f_s = -1;
    const double room = cap_tol[d] - mem[d];
    const bool empty = mem[d] < 1.0;
    for (int s : stages_of[d]) {
      int m = nb[s];
      if (m < nf[s]) {
        const double fe = fend[static_cast<size_t>(s) * M + m];
        double ready;
        if (s == last) {
          ready = fe;
        } else {
          const double g = iend[static_cast<size_t>(s + 1) * M + m];
          ready = g < 0 ? -1.0 : (fe > g + c.comm[s] ? fe : g + c.comm[s]);
        }
        if (ready >= 0) {
          const double st = ready > t ? ready : t;
          if (st < b_st) {
            b_st = st;
            b_s = s;
          }
        }
      }
      m = nf[s];
      if (m < M) {
        double ready;
        if (s == 0) {
          ready = 0.0;
        } else {
          const double pe = fend[static_cast<size_t>(s - 1) * M + m];
          ready = pe < 0 ? -1.0 : pe + c.comm[s - 1];
        }
        if (ready >= 0 && (force || need[s] <= room || empty)) {
          const double st = ready > t ? ready : t;
          if (st < f_st) {
            f_st = st;
            f_s = s;
          }
        }
      }
    }
    const auto& q = wq[d];
    const double w_st = q.empty() ? INF : t;
    const double start = std::min(std::min(b_st, f_st), w_st);
    Choice choice{INF, 9, -1, -1};
    if (start == INF) return choice;
    if (b_st <= start) choice = Choice{b_st, 0, b_s, 1};
    if (f_st <= start && tuple_less(1, f_s, 0, choice.prio, choice.stage, choice.kind))
      choice = Choice{f_st, 1, f_s, 0};
    if (w_st <= start) {
      const int w_prio = static_cast<long long>(q.size()) < max_w ? 2 : 0;
      if (tuple_less(w_prio, q.front().first, 2, choice.prio, choice.stage, choice.kind))
        choice = Choice{w_st, w_prio, q.front().first, 2};
    }
    return choice;
  };

  // The Python reference keeps a heap of (start, device, version) with stale entries skipped: it
  // picks the device with the earliest cached start, the lowest index on ties, among devices with
  // work left. A scan of one contiguous array of those starts gives the same pick, and is faster
  // than a heap or a tournament tree for the few dozen devices of a pipeline.
  std::vector<Choice> cache(devices, Choice{INF, 9, -1, -1});
  std::vector<double> key(devices, INF);  // cached start of each device with work left; INF otherwise
  auto update = [&](int d) {
    if (remaining[d]) {
      cache[d] = best(d, false);
      key[d] = cache[d].start;
    } else {
      key[d] = INF;
    }
  };
  for (int d = 0; d < devices; ++d) update(d);
  long long done = 0;
  Order out;
  while (done < total) {
    int pick_d = -1;
    double least = INF;
    for (int d = 0; d < devices; ++d) {
      if (key[d] < least) {
        least = key[d];
        pick_d = d;
      }
    }
    Choice pick = pick_d >= 0 ? cache[pick_d] : Choice{INF, 9, -1, -1};
    if (pick_d < 0 || pick.start == INF) {
      // Every device waits on its memory cap: let the earliest forward through.
      pick_d = -1;
      for (int d = 0; d < devices; ++d) {
        if (remaining[d]) {
          Choice ch = best(d, true);
          if (pick_d < 0 || ch.start < pick.start) {
            pick = ch;
            pick_d = d;
          }
        }
      }
      if (pick_d < 0 || pick.start == INF) {
        out.error = "list scheduler is stuck; the placement may not form a pipeline";
        return out;
      }
    }
    const int d = pick_d;
    const double start = pick.start;
    int s = pick.stage;
    int touched[2] = {d, -1};
    double end;
    auto emit = [&](int stage, int op, int m) {
      order[d].push_back(stage);
      order[d].push_back(op);
      order[d].push_back(m);
    };
    if (pick.kind == 0) {
      const int m = nf[s]++;
      end = start + c.f[s];
      fend[static_cast<size_t>(s) * M + m] = end;
      mem[d] += c.act[s];
      emit(s, OP_F, m);
      if (s < last) touched[1] = placement[s + 1];
    } else if (pick.kind == 1) {
      const int m = nb[s]++;
      if (cfg.split) {
        end = start + c.i[s];
        mem[d] -= cfg.count_w ? c.act[s] - c.keep[s] : c.act[s];
        emit(s, OP_I, m);
        if (cfg.eager) {
          end += c.w[s];
          if (cfg.count_w) mem[d] -= c.keep[s];
          emit(s, OP_W, m);
          remaining[d] -= 1;
          done += 1;
        } else {
          wq[d].emplace_back(s, m);
        }
      } else {
        end = start + c.backward[s];
        mem[d] -= c.act[s];
        emit(s, OP_B, m);
      }
      iend[static_cast<size_t>(s) * M + m] = (cfg.split && cfg.eager) ? end - c.w[s] : end;
      if (s > 0) touched[1] = placement[s - 1];
    } else {
      const auto [ws, wm] = wq[d].front();
      wq[d].pop_front();
      s = ws;
      end = start + c.w[s];
      if (cfg.count_w) mem[d] -= c.keep[s];
      emit(s, OP_W, wm);
    }
    free_at[d] = end;
    remaining[d] -= 1;
    done += 1;
    for (int k = 0; k < 2; ++k) {
      const int e = touched[k];
      if (e < 0 || (k == 1 && e == d)) continue;  // the Python reference uses a set {d, other}
      update(e);
    }
  }
  out.offsets.assign(devices + 1, 0);
  size_t n = 0;
  for (int d = 0; d < devices; ++d) n += order[d].size();
  out.rows.reserve(n);
  for (int d = 0; d < devices; ++d) {
    out.rows.insert(out.rows.end(), order[d].begin(), order[d].end());
    out.offsets[d + 1] = out.offsets[d] + static_cast<int64_t>(order[d].size() / 3);
  }
  return out;
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

}  // namespace

PYBIND11_MODULE(_engine, mod) {
  mod.doc() = "Compiled list scheduler and event simulator (see pipeline/_native/engine.cpp).";
  mod.attr("ABI") = 1;

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
