// The native core of adaptis/Pipeline-v0's batched environment (env/vector_env.py).
//
// Included by engine.cpp inside its anonymous namespace (one build, one module). It ports the step
// of the readable Python reference, env/pipeline_env.py's PipelineEnv.step_core and
// observation_parts over env/editor.py's PlanEditor, for the scenarios whose stage costs it ports
// (pipeline/simulator.py's stage_costs on the `ideal` runtime, no shared weight groups, no
// calibrated or measured backward columns, no W depth, no transfer overhead or contention:
// env/native_core.py checks, and every other episode steps in Python). Per environment it holds
// the current and best candidates, their results, the edit table (each action's candidate, the
// mask), the candidates the episode evaluated and those tried since the last kept edit, the step
// and call counters. A step applies each environment's edit, schedules and simulates the new plan
// in-process (ListScheduler and simulate, above), recomputes the mask and writes observations,
// rewards, flags and masks into arrays that Python views. Every floating-point operation is the
// reference's, in its order (numpy's sums pairwise, as numpy sums), so both give bit-identical
// observations and rewards: tests/env/test_native_core.py checks it on thousands of trajectories.
//
// The environments of one step run on BatchPool (the persistent helper threads): each is independent.

constexpr int EC_MAX_DEVICES = 32, EC_MAX_STAGES = 128, EC_NS = 15, EC_ND = 11, EC_NG = 33;
constexpr int EC_N_ACTIONS = 344;
constexpr int A_GROW_LEFT = 1, A_GROW_RIGHT = A_GROW_LEFT + EC_MAX_STAGES - 1, A_FAMILY = A_GROW_RIGHT + EC_MAX_STAGES - 1;
constexpr int N_FAMILIES = 7, N_PRESETS = 5;
constexpr int A_REBALANCE = A_FAMILY + N_FAMILIES, A_BUDGET_UP = A_REBALANCE + 1;
constexpr int A_BUDGET_DOWN = A_BUDGET_UP + EC_MAX_DEVICES, A_ALL_UP = A_BUDGET_DOWN + EC_MAX_DEVICES;
constexpr int A_PRESET = A_ALL_UP + 2, A_TOGGLE = A_PRESET + N_PRESETS, A_PENDING = A_TOGGLE + 4;
constexpr int A_HOT = A_PENDING + 3, A_FIT = A_HOT + 2;
static_assert(A_FIT + 1 == EC_N_ACTIONS, "the action table of env/editor.py");
constexpr double EC_CLIP = 8.0;

// numpy's sum of a contiguous float64 array (pairwise, 8 accumulators, blocks of 128).
double np_sum(const double* a, long long n) {
  if (n < 8) {
    double r = 0.0;
    for (long long i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    long long i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  long long n2 = n / 2;
  n2 -= n2 % 8;
  return np_sum(a, n2) + np_sum(a + n2, n - n2);
}

// Python's max(a, b) / min(a, b): the first unless the second is strictly greater / smaller.
inline double py_max(double a, double b) { return b > a ? b : a; }
inline double py_min(double a, double b) { return b < a ? b : a; }
inline double py_clip(double v) { return py_min(EC_CLIP, py_max(-EC_CLIP, v)); }
inline float np_clip(double v) {  // float32 cast, then numpy's clip (NaN stays NaN)
  const float f = static_cast<float>(v);
  return f < -8.0f ? -8.0f : (f > 8.0f ? 8.0f : f);
}

// A candidate (pipeline/candidates.py's Candidate) of order "list" without recomputation.
struct Cand {
  std::vector<int> sizes, placement;
  bool has_b = false;
  std::vector<double> budgets;
  bool split = true, eager = false, depth = true, count_w = true;
  int mpw = -1;  // max_pending_w, -1: None

  std::string key() const {  // equal keys <=> equal candidates
    std::string k;
    k.reserve(8 + 4 * (sizes.size() + placement.size()) + 8 * budgets.size());
    auto put = [&k](const void* p, size_t n) { k.append(static_cast<const char*>(p), n); };
    const int32_t ns = static_cast<int32_t>(sizes.size());
    put(&ns, 4);
    put(sizes.data(), 4 * sizes.size());
    put(placement.data(), 4 * placement.size());
    const char flags[6] = {static_cast<char>(has_b), static_cast<char>(split), static_cast<char>(eager),
                           static_cast<char>(depth), static_cast<char>(count_w), 0};
    put(flags, 6);
    put(&mpw, 4);
    if (has_b)
      for (double x : budgets) {
        x += 0.0;  // -0 == +0
        put(&x, 8);
      }
    return k;
  }
};

struct Res {
  bool valid = true, feasible = true;
  int cls = 0;          // objective_key: 0 fits, 1 overflows, 2 invalid
  double over = 0.0;    // memory overflow, bytes
  double t = INF;       // iteration time
  std::vector<double> busy, peak, limit;
};

bool key_less(const Res& a, const Res& b) {  // objective_key(a) < objective_key(b)
  if (a.cls != b.cls) return a.cls < b.cls;
  if (a.over < b.over) return true;
  if (b.over < a.over) return false;
  if (a.over != b.over) return false;  // NaN: tuples compare no further
  return a.t < b.t;
}

// What an environment's episodes need of one scenario (built once per scenario object in Python).
struct EnvScenario {
  int P = 0, M = 0, L = 0;
  std::vector<double> lf, lb, lw, lact, lkeep, lparams, lout, lws, lwws;  // per layer (lkeep: w_graph or w_retained)
  bool has_ws = false, has_wws = false, defers = true;
  double over = 0.0, scale = 1.0, param_bytes = 0.0, unit = 1.0, post = 0.0;
  std::vector<double> speeds;        // per device, for stage costs (speed / compute_scale)
  std::vector<double> cspeeds;       // per device, the cluster's (stage times)
  std::vector<double> lat, bw;       // per device pair: latency seconds, bytes per second
  std::vector<double> limits;        // per device, bytes
  std::vector<double> prefix, cost, act_prefix;  // _Prep's
  std::vector<int> node;
  int nodes = 1;
  double bound = 0.0;
  std::vector<double> consts;        // _Prep.consts (5)
  std::vector<float> dev_template;   // _Prep.devices (MAX_DEVICES x ND)
  std::vector<std::vector<int>> fam_place;  // make_placement of each family on P devices
  std::vector<char> fam_target;      // fits the scenario's layers (an action applies)
  std::vector<char> fam_kind;        // counts for family_of (chunks == 1 or P >= 2)
  std::vector<std::pair<std::vector<int>, std::vector<int>>> balanced;  // placement -> DP-balanced sizes
  std::vector<char> preset_has;
  std::vector<std::vector<double>> presets;

  const std::vector<int>* balanced_of(const std::vector<int>& placement) const {
    for (const auto& kv : balanced)
      if (kv.first == placement) return &kv.second;
    return nullptr;
  }
};

struct ECosts {
  StageCosts sc;
  std::vector<double> stat;  // static bytes per device (transient included)
};

ECosts env_stage_costs(const EnvScenario& z, const Cand& c) {
  const int S = static_cast<int>(c.sizes.size());
  const int P = z.P;
  ECosts out;
  auto& k = out.sc;
  k.f.resize(S); k.i.resize(S); k.w.resize(S); k.act.resize(S); k.keep.resize(S); k.comm.resize(S);
  k.backward.resize(S);
  std::vector<double> stat(P, 0.0), transient(P, 0.0);
  int a = 0;
  for (int s = 0; s < S; ++s) {
    const int b = a + c.sizes[s];
    const int d = c.placement[s];
    const double sp = z.speeds[d];
    double sf = 0.0, sb = 0.0, sw = 0.0, sa = 0.0, sk = 0.0, spar = 0.0;
    for (int x = a; x < b; ++x) {
      sf += z.lf[x]; sb += z.lb[x]; sw += z.lw[x]; sa += z.lact[x]; sk += z.lkeep[x]; spar += z.lparams[x];
    }
    const double fwd = sf / sp, bwd_w = sw / sp;
    const double i_s = sb / sp + z.over, w_s = bwd_w + z.over;
    const double full = z.scale * sa;
    double act_s, keep_s;
    if (s == 0 && z.defers) {
      act_s = keep_s = full;
    } else {
      act_s = full;
      keep_s = z.scale * sk;
    }
    k.f[s] = fwd + z.over;
    k.i[s] = i_s;
    k.w[s] = w_s;
    k.act[s] = act_s;
    k.keep[s] = keep_s;
    if (z.has_ws) {
      double m = 0.0;
      if (b > a) {
        m = z.lws[a];
        for (int x = a + 1; x < b; ++x) m = py_max(m, z.lws[x]);
      }
      transient[d] = py_max(transient[d], m);
    }
    if (z.has_wws) {  // simulator.stage_costs: beyond the min(act, keep) the stage's backward has freed
      double m = 0.0;
      if (b > a) {
        m = z.lwws[a];
        for (int x = a + 1; x < b; ++x) m = py_max(m, z.lwws[x]);
      }
      transient[d] = py_max(transient[d], m - py_min(act_s, keep_s));
    }
    stat[d] += z.param_bytes * spar;
    if (s < S - 1) {
      const int nxt = c.placement[s + 1];
      k.comm[s] = d == nxt ? 0.0 : (z.lat[d * P + nxt] + z.lout[b - 1] / z.bw[d * P + nxt]) / z.unit;
    } else {
      k.comm[s] = 0.0;
    }
    a = b;
  }
  for (int s = 0; s < S; ++s) k.backward[s] = k.i[s] + k.w[s];
  out.stat.resize(P);
  for (int d = 0; d < P; ++d) out.stat[d] = stat[d] + transient[d];
  return out;
}

// Evaluator.result of a candidate on the compiled engine (list_config, schedule, simulate, Result).
Res env_evaluate(const EnvScenario& z, const Cand& c) {
  const ECosts costs = env_stage_costs(z, c);
  const int P = z.P, S = static_cast<int>(c.sizes.size());
  ListConfig cfg;
  if (c.has_b) {
    std::vector<double> per(P, 0.0);
    for (int s = 0; s < S; ++s) per[c.placement[s]] += costs.sc.act[s];
    cfg.caps.resize(P);
    for (int d = 0; d < P; ++d) cfg.caps[d] = py_max(1.0, c.budgets[d]) * per[d];
  }
  cfg.split = c.split;
  cfg.eager = c.eager;
  cfg.depth = c.depth;
  cfg.max_pending_w = c.mpw;
  cfg.count_w = c.count_w;
  Order o = list_schedule(costs.sc, c.placement, P, z.M, cfg);
  if (!o.error.empty()) throw std::runtime_error("native env core: " + o.error);
  SimOut r = simulate(costs.sc, P, z.M, o.rows.data(), o.offsets.data(), false);
  if (!r.ok) throw std::runtime_error("native env core: the list scheduler's order deadlocked");
  Res res;
  res.t = r.makespan + z.post;
  res.busy = r.busy;
  res.peak.resize(P);
  for (int d = 0; d < P; ++d) res.peak[d] = costs.stat[d] + r.peak[d];
  res.limit = z.limits;
  res.feasible = true;
  double over = 0.0;
  for (int d = 0; d < P; ++d) {
    if (!(res.peak[d] <= res.limit[d])) res.feasible = false;
    over += py_max(0.0, res.peak[d] - res.limit[d]);
  }
  res.over = over;
  res.cls = over <= 0 ? 0 : 1;
  return res;
}

double env_score(const Res& r, double reference) {
  if (!r.valid) return -3.0;
  if (!r.feasible) {
    double over = 0.0;
    for (size_t d = 0; d < r.peak.size(); ++d) over += py_max(0.0, r.peak[d] - r.limit[d]) / r.limit[d];
    const double n = static_cast<double>(std::max<size_t>(1, r.peak.size()));
    return -1.0 - py_min(1.0, over / n);
  }
  return reference / r.t;
}

// One environment's episode.
struct EnvSlot {
  std::shared_ptr<EnvScenario> z;
  bool active = false;
  Cand cur, best;
  Res cur_r, best_r;
  std::unordered_set<std::string> known, tried;
  long long calls = 0, max_calls = -1, calls_cap = 1, calls_at_start = 0;
  bool allow_stop = true, last_kept = false;
  int steps = 0, max_steps = 24;
  double step_cost = 0.002, reference = 1.0, start_time = INF;
  // the edit table of the current state
  std::vector<Cand> found;                 // candidates of the actions that apply
  std::vector<std::string> found_key;
  std::vector<int> target;                 // action -> index in found, -1: none
  std::vector<char> allowed;
  unsigned long long version = 0, best_version = 0;  // bumped when current / best change
  bool obs_stale = true;
  float head[25], tail[5];

  bool budget_left() const { return max_calls < 0 || calls < max_calls; }
};

std::vector<double> stage_times_of(const EnvScenario& z, const Cand& c) {
  std::vector<double> out(c.sizes.size());
  int j = 0;
  for (size_t s = 0; s < c.sizes.size(); ++s) {
    const int n = c.sizes[s];
    out[s] = (z.prefix[j + n] - z.prefix[j]) / z.cspeeds[c.placement[s]];
    j += n;
  }
  return out;
}

bool move_into(const Cand& c, int src, int dst, Cand& out) {  // move_layers, one layer
  if (src == dst || c.sizes[src] <= 1) return false;
  out = c;
  out.sizes[src] -= 1;
  out.sizes[dst] += 1;
  return true;
}

bool bottleneck_move(const EnvScenario& z, const EnvSlot& e, bool hot, Cand& out) {
  const Cand& c = e.cur;
  const Res& res = e.cur_r;
  const int S = static_cast<int>(c.sizes.size());
  if (!res.valid || S < 2) return false;
  const std::vector<double>& busy = res.busy;
  int d = 0;
  for (int x = 1; x < static_cast<int>(busy.size()); ++x)
    if (hot ? busy[x] > busy[d] : busy[x] < busy[d]) d = x;
  const std::vector<double> times = stage_times_of(z, c);
  int s = -1;
  for (int x = 0; x < S; ++x) {
    if (c.placement[x] != d) continue;
    if (s < 0 || (hot ? times[x] > times[s] : times[x] < times[s])) s = x;
  }
  if (s < 0) throw std::runtime_error("native env core: a device holds no stage");
  int n = -1;
  for (int x : {s - 1, s + 1}) {
    if (x < 0 || x >= S) continue;
    if (n < 0 || (hot ? times[x] < times[n] : times[x] > times[n])) n = x;
  }
  return hot ? move_into(c, s, n, out) : move_into(c, n, s, out);
}

bool fit_memory_of(const EnvScenario& z, const Cand& c, const Res& r, Cand& out) {
  if (!r.valid || r.feasible) return false;
  const int P = static_cast<int>(r.peak.size());
  const ECosts costs = env_stage_costs(z, c);
  std::vector<double> per(P, 0.0);
  for (size_t s = 0; s < c.placement.size(); ++s)
    per[c.placement[s]] += c.split ? py_max(costs.sc.act[s], costs.sc.keep[s]) : costs.sc.act[s];
  std::vector<double> budgets(P);
  for (int d = 0; d < P; ++d) {
    const double cur = c.has_b ? c.budgets[d] : static_cast<double>(z.M);
    const double room = r.limit[d] - costs.stat[d];
    if (room <= 0) return false;
    const double fit = per[d] > 0 ? std::trunc(room / per[d]) : cur;
    budgets[d] = py_max(1.0, py_min(cur, fit));
  }
  if (c.has_b && budgets == c.budgets) return false;
  out = c;
  out.has_b = true;
  out.budgets = std::move(budgets);
  out.count_w = true;
  return true;
}

// PlanEditor.targets: the candidate of each action and the mask of the current state.
void compute_targets(EnvSlot& e) {
  const EnvScenario& z = *e.z;
  const Cand& c = e.cur;
  const int S = static_cast<int>(c.sizes.size()), P = z.P;
  e.found.clear();
  std::vector<int> acts;
  auto add = [&](int a, Cand&& t) {
    acts.push_back(a);
    e.found.push_back(std::move(t));
  };
  Cand t;
  for (int i = 0; i < S - 1; ++i) {
    if (c.sizes[i + 1] > 1 && move_into(c, i + 1, i, t)) add(A_GROW_LEFT + i, std::move(t));
    if (c.sizes[i] > 1 && move_into(c, i, i + 1, t)) add(A_GROW_RIGHT + i, std::move(t));
  }
  for (int k = 0; k < N_FAMILIES; ++k) {
    if (!z.fam_target[k]) continue;
    const std::vector<int>* sizes = z.balanced_of(z.fam_place[k]);
    if (sizes == nullptr) throw std::runtime_error("native env core: no balanced split of a family placement");
    t = c;
    t.placement = z.fam_place[k];
    t.sizes = *sizes;
    add(A_FAMILY + k, std::move(t));
  }
  {
    const std::vector<int>* sizes = z.balanced_of(c.placement);
    if (sizes == nullptr) throw std::runtime_error("native env core: no balanced split of the current placement");
    t = c;
    t.sizes = *sizes;
    add(A_REBALANCE, std::move(t));
  }
  if (c.has_b) {
    const double cap = static_cast<double>(std::max(z.M, 1));
    for (int d = 0; d < P; ++d) {
      const double x = c.budgets[d];
      const double up = py_min(cap, py_max(1.0, x + 1.0)), down = py_min(cap, py_max(1.0, x - 1.0));
      if (up != x) {
        t = c;
        t.budgets[d] = up;
        add(A_BUDGET_UP + d, std::move(t));
      }
      if (down != x) {
        t = c;
        t.budgets[d] = down;
        add(A_BUDGET_DOWN + d, std::move(t));
      }
    }
    for (int k = 0; k < 2; ++k) {
      t = c;
      for (double& x : t.budgets) x = py_min(cap, py_max(1.0, k == 0 ? x + 1.0 : x - 1.0));
      add(A_ALL_UP + k, std::move(t));
    }
  }
  for (int k = 0; k < N_PRESETS; ++k) {
    t = c;
    t.has_b = z.preset_has[k];
    t.budgets = z.preset_has[k] ? z.presets[k] : std::vector<double>{};
    add(A_PRESET + k, std::move(t));
  }
  for (int k = 0; k < 4; ++k) {
    t = c;
    bool& knob = k == 0 ? t.split : k == 1 ? t.eager : k == 2 ? t.depth : t.count_w;
    knob = !knob;
    add(A_TOGGLE + k, std::move(t));
  }
  for (int k = 0; k < 3; ++k) {
    t = c;
    t.mpw = k == 0 ? -1 : k == 1 ? 2 : P;
    add(A_PENDING + k, std::move(t));
  }
  if (bottleneck_move(z, e, true, t)) add(A_HOT, std::move(t));
  if (bottleneck_move(z, e, false, t)) add(A_HOT + 1, std::move(t));
  if (fit_memory_of(z, c, e.cur_r, t)) add(A_FIT, std::move(t));
  const std::string ck = c.key();
  e.found_key.resize(e.found.size());
  e.target.assign(EC_N_ACTIONS, -1);
  e.allowed.assign(EC_N_ACTIONS, 0);
  bool any = false;
  for (size_t k = 0; k < e.found.size(); ++k) {
    e.found_key[k] = e.found[k].key();
    const std::string& key = e.found_key[k];
    if (key == ck || e.tried.count(key) || e.known.count(key)) continue;
    e.target[acts[k]] = static_cast<int>(k);
    e.allowed[acts[k]] = 1;
    any = true;
  }
  e.allowed[0] = e.allow_stop || !any;
}

// The parts of the observation that depend on the current plan (PipelineEnv._state_obs).
void state_obs(const EnvSlot& e, float* st, float* dv, float* head, float* tail) {
  const EnvScenario& z = *e.z;
  const Cand& c = e.cur;
  const Res& res = e.cur_r;
  const int P = z.P, M = z.M, S = static_cast<int>(c.sizes.size());
  std::vector<double> per_dev(P, 0.0), chunk(S), cross(S, 0.0);
  std::vector<int> seen(P, 0);
  for (int s = 0; s < S; ++s) per_dev[c.placement[s]] += 1.0;
  for (int s = 0; s < S; ++s) {
    const int d = c.placement[s];
    chunk[s] = static_cast<double>(seen[d]++);
  }
  for (int s = 0; s < S; ++s) chunk[s] /= py_max(per_dev[c.placement[s]] - 1, 1);  // np.maximum
  for (int s = 0; s + 1 < S; ++s) cross[s] = z.node[c.placement[s]] != z.node[c.placement[s + 1]] ? 1.0 : 0.0;
  std::vector<double> times(S), act(S), sp(S), sizes(S);
  std::vector<int> starts(S), ends(S);
  long long total = 0;
  int j = 0;
  for (int s = 0; s < S; ++s) {
    starts[s] = j;
    j += c.sizes[s];
    ends[s] = j;
    total += c.sizes[s];
    sizes[s] = static_cast<double>(c.sizes[s]);
    sp[s] = z.cspeeds[c.placement[s]];
    times[s] = (z.prefix[ends[s]] - z.prefix[starts[s]]) / sp[s];
    act[s] = z.act_prefix[ends[s]] - z.act_prefix[starts[s]];
  }
  const double mean_t = py_max(np_sum(times.data(), S) / S, 1e-12);
  double tmax = times[0];
  for (int s = 1; s < S; ++s) tmax = std::max(tmax, times[s]);
  const double act_sum = np_sum(act.data(), S);
  const bool valid = res.valid;
  std::vector<double> busy(P, 0.0), mem(P);
  int hot = -1, cold = -1;
  if (valid) {
    const double t = py_max(res.t, 1e-12);
    for (int d = 0; d < P; ++d) busy[d] = res.busy[d] / t;
    hot = cold = 0;
    for (int d = 1; d < P; ++d) {
      if (busy[d] > busy[hot]) hot = d;
      if (busy[d] < busy[cold]) cold = d;
    }
  }
  for (int d = 0; d < P; ++d) mem[d] = res.peak[d] / z.limits[d];
  std::fill(st, st + EC_MAX_STAGES * EC_NS, 0.0f);
  const double size_scale = S / static_cast<double>(total);
  const double act_scale = S / py_max(act_sum, 1e-12);
  const double tmax_c = py_max(tmax, 1e-12);
  for (int s = 0; s < S; ++s) {
    float* row = st + s * EC_NS;
    const int d = c.placement[s];
    row[0] = 1.0f;
    row[1] = np_clip(sizes[s] * size_scale);
    row[2] = np_clip(times[s] / mean_t);
    row[3] = np_clip(times[s] / tmax_c);
    row[4] = np_clip(z.cost[starts[s]] / sp[s] / mean_t);
    row[5] = np_clip(z.cost[ends[s] - 1] / sp[s] / mean_t);
    row[6] = np_clip(act[s] * act_scale);
    row[7] = np_clip(static_cast<double>(s) / std::max(1, S - 1));
    row[8] = np_clip(static_cast<double>(d + 1) / P);
    row[9] = np_clip(chunk[s]);
    row[10] = np_clip(busy[d]);
    row[11] = np_clip(mem[d]);
    row[12] = d == hot ? 1.0f : 0.0f;
    row[13] = d == cold ? 1.0f : 0.0f;
    row[14] = np_clip(cross[s]);
  }
  std::copy(z.dev_template.begin(), z.dev_template.end(), dv);
  for (int d = 0; d < P; ++d) {
    float* row = dv + d * EC_ND;
    row[1] = static_cast<float>(busy[d]);
    row[2] = static_cast<float>(mem[d]);
    if (c.has_b)
      row[3] = static_cast<float>(c.budgets[d] / P);
    else
      row[4] = 1.0f;
    row[6] = static_cast<float>(per_dev[d] * (static_cast<double>(P) / S));
  }
  if (valid) {
    dv[hot * EC_ND + 7] = 1.0f;
    dv[cold * EC_ND + 8] = 1.0f;
  }
  for (int k = 0; k < EC_MAX_DEVICES * EC_ND; ++k) dv[k] = np_clip(dv[k]);
  // family_of
  int fam = -1;
  for (int k = 0; k < N_FAMILIES; ++k)
    if (z.fam_kind[k] && z.fam_place[k] == c.placement) {
      fam = k;
      break;
    }
  double h[25];
  int n = 0;
  h[n++] = std::log2(static_cast<double>(P)) / 5;
  h[n++] = std::log2(static_cast<double>(M)) / 8;
  h[n++] = std::log2(static_cast<double>(z.L)) / 8;
  h[n++] = static_cast<double>(S) / P / 4;
  h[n++] = static_cast<double>(M) / S;
  for (int k = 0; k <= N_FAMILIES; ++k) h[n + k] = 0.0;
  h[n + (fam < 0 ? N_FAMILIES : fam)] = 1.0;
  n += N_FAMILIES + 1;
  h[n++] = c.split;
  h[n++] = c.eager;
  h[n++] = c.depth;
  h[n++] = c.count_w;
  h[n++] = c.mpw < 0;
  h[n++] = c.mpw == 2;
  h[n++] = c.mpw == P;
  h[n++] = !c.has_b;
  const double t = valid ? res.t : INF;
  h[n++] = std::isfinite(t) && z.bound > 0 ? std::log(t / z.bound) : EC_CLIP;
  h[n++] = std::isfinite(t) && std::isfinite(e.start_time) ? std::log(e.start_time / t) : 0.0;
  h[n++] = res.feasible;
  std::vector<double> excess(P);
  for (int d = 0; d < P; ++d) excess[d] = std::max(mem[d] - 1.0, 0.0);
  h[n++] = np_sum(excess.data(), P);
  for (int k = 0; k < n; ++k) head[k] = static_cast<float>(py_clip(h[k]));
  for (int k = 0; k < 5; ++k) tail[k] = static_cast<float>(py_clip(z.consts[k]));
}

// pipeline/balance.py's balanced_sizes for finite prefix sums and speeds: layers per stage minimising the
// heaviest stage's time, the first least split point kept (numpy's argmin), the same divisions.
std::vector<int> balanced_split(const std::vector<double>& pre, const std::vector<double>& sp) {
  const int S = static_cast<int>(sp.size()), L = static_cast<int>(pre.size()) - 1;
  if (S < 1 || S > L) throw std::invalid_argument("balanced_split needs 1..layers stages");
  for (double x : pre)
    if (!std::isfinite(x)) throw std::invalid_argument("balanced_split needs finite costs");
  for (double x : sp)
    if (!(0.0 < x && x < INF)) throw std::invalid_argument("balanced_split needs finite positive speeds");
  const int n = L - S + 1;
  std::vector<double> best(static_cast<size_t>(S) * (L + 1), INF);
  std::vector<int> arg(static_cast<size_t>(S) * (L + 1), 0);
  for (int j = 1; j <= L; ++j) best[j] = pre[j] / sp[0];
  for (int s = 1; s < S; ++s) {
    const double v = sp[s];
    const double* prev = best.data() + static_cast<size_t>(s - 1) * (L + 1);
    double* cur = best.data() + static_cast<size_t>(s) * (L + 1);
    int* where = arg.data() + static_cast<size_t>(s) * (L + 1);
    for (int j = s + 1; j <= s + n; ++j) {
      double lo = INF;
      int at = 0;
      for (int r = 0; r < n; ++r) {  // i = s + r; i >= j is infinite
        const int i = s + r;
        const double span = i < j ? (pre[j] - pre[i]) / v : INF;
        const double val = span > prev[i] ? span : prev[i];  // np.maximum
        if (r == 0 || val < lo) {  // the first least one
          lo = val;
          at = r;
        }
      }
      cur[j] = lo;
      where[j] = at + s;
    }
  }
  std::vector<int> sizes;
  int j = L;
  for (int s = S - 1; s > 0; --s) {
    const int i = arg[static_cast<size_t>(s) * (L + 1) + j];
    sizes.push_back(j - i);
    j = i;
  }
  sizes.push_back(j);
  std::reverse(sizes.begin(), sizes.end());
  return sizes;
}

// ------------------------------------------------------------------ the batch of environments

Cand cand_from(const py::handle& obj) {
  // (sizes, placement, budgets or None, split_backward, eager_w, depth_first, max_pending_w or None, cap_counts_w)
  const py::tuple t = py::reinterpret_borrow<py::object>(obj).cast<py::tuple>();
  if (t.size() != 8) throw std::invalid_argument("a candidate is an 8-tuple (see env/native_core.py)");
  Cand c;
  c.sizes = t[0].cast<std::vector<int>>();
  c.placement = t[1].cast<std::vector<int>>();
  if (c.sizes.size() != c.placement.size() || c.sizes.empty() || c.sizes.size() > EC_MAX_STAGES)
    throw std::invalid_argument("a candidate needs 1..128 stages, one device each");
  c.has_b = !t[2].is_none();
  if (c.has_b) c.budgets = t[2].cast<std::vector<double>>();
  c.split = t[3].cast<bool>();
  c.eager = t[4].cast<bool>();
  c.depth = t[5].cast<bool>();
  c.mpw = t[6].is_none() ? -1 : t[6].cast<int>();
  c.count_w = t[7].cast<bool>();
  return c;
}

void check_cand(const EnvScenario& z, const Cand& c) {
  long long total = 0;
  for (size_t s = 0; s < c.sizes.size(); ++s) {
    if (c.sizes[s] < 1) throw std::invalid_argument("a candidate's stage sizes must be >= 1");
    if (c.placement[s] < 0 || c.placement[s] >= z.P)
      throw std::invalid_argument("a candidate's placement names a device outside the scenario");
    total += c.sizes[s];
  }
  if (total != z.L) throw std::invalid_argument("a candidate's stage sizes must add up to the layers");
  if (c.has_b && static_cast<int>(c.budgets.size()) != z.P)
    throw std::invalid_argument("a candidate's budgets need one entry per device");
  if (c.mpw < -1) throw std::invalid_argument("max_pending_w must be None or >= 0");
}

Res res_from(const py::handle& obj, int P) {
  // (valid, iteration_time, busy, peak_memory, memory_limit)
  const py::tuple t = py::reinterpret_borrow<py::object>(obj).cast<py::tuple>();
  if (t.size() != 5) throw std::invalid_argument("a result is a 5-tuple (see env/native_core.py)");
  Res r;
  r.valid = t[0].cast<bool>();
  r.t = t[1].cast<double>();
  r.busy = t[2].cast<std::vector<double>>();
  r.peak = t[3].cast<std::vector<double>>();
  r.limit = t[4].cast<std::vector<double>>();
  if (static_cast<int>(r.busy.size()) != P || static_cast<int>(r.peak.size()) != P ||
      static_cast<int>(r.limit.size()) != P)
    throw std::invalid_argument("a result needs one busy time, peak and limit per device");
  double over = 0.0;
  r.feasible = r.valid;
  for (int d = 0; d < P; ++d) {
    if (!(r.peak[d] <= r.limit[d])) r.feasible = false;
    over += py_max(0.0, r.peak[d] - r.limit[d]);
  }
  if (!r.valid) {
    r.cls = 2;
    r.over = INF;
    r.t = INF;
  } else {
    r.over = over;
    r.cls = over <= 0 ? 0 : 1;
  }
  return r;
}

// The checks of a scenario table read from Python or from bytes (env_start.hpp); sets nodes.
void check_scenario(EnvScenario& table) {
  EnvScenario* z = &table;
  const int P = z->P, L = z->L;
  const size_t l = static_cast<size_t>(L), p = static_cast<size_t>(P);
  if (P < 1 || P > EC_MAX_DEVICES || z->M < 1 || L < 1)
    throw std::invalid_argument("scenario table: 1..32 devices, >= 1 micro-batch and >= 1 layer");
  if (z->lb.size() != l || z->lw.size() != l || z->lact.size() != l || z->lkeep.size() != l ||
      z->lparams.size() != l || z->lout.size() != l || (z->has_ws && z->lws.size() != l) || (z->has_wws && z->lwws.size() != l) || z->cost.size() != l ||
      z->prefix.size() != l + 1 || z->act_prefix.size() != l + 1)
    throw std::invalid_argument("scenario table: per-layer columns of different lengths");
  if (z->speeds.size() != p || z->cspeeds.size() != p || z->limits.size() != p || z->node.size() != p ||
      z->lat.size() != p * p || z->bw.size() != p * p || z->consts.size() != 5 ||
      z->dev_template.size() != static_cast<size_t>(EC_MAX_DEVICES * EC_ND))
    throw std::invalid_argument("scenario table: per-device columns of the wrong length");
  for (const auto& kv : z->balanced) {
    const auto& placement = kv.first;
    if (placement.size() != kv.second.size()) throw std::invalid_argument("scenario table: a balanced split's length");
    for (int x : placement)
      if (x < 0 || x >= P) throw std::invalid_argument("scenario table: a placement names a device outside");
    long long total = 0;
    for (int x : kv.second) {
      if (x < 1) throw std::invalid_argument("scenario table: a balanced split has an empty stage");
      total += x;
    }
    if (total != L) throw std::invalid_argument("scenario table: a balanced split does not cover the layers");
  }
  for (int k = 0; k < N_FAMILIES; ++k) {
    for (int x : z->fam_place[k])
      if (x < 0 || x >= P) throw std::invalid_argument("scenario table: a family placement names a device outside");
    if (z->fam_target[k] && z->balanced_of(z->fam_place[k]) == nullptr)
      throw std::invalid_argument("scenario table: a family placement lacks its balanced split");
  }
  for (int k = 0; k < N_PRESETS; ++k)
    if (z->preset_has[k] && z->presets[k].size() != p) throw std::invalid_argument("scenario table: preset length");
  for (int x : z->node)
    if (x < 0 || x >= P) throw std::invalid_argument("scenario table: a device's node is out of range");
  int nodes = 1;
  for (int x : z->node) nodes = std::max(nodes, x + 1);
  z->nodes = nodes;
}

template <typename T>
std::vector<T> vec_of(const py::dict& d, const char* name) {
  if (!d.contains(name)) throw std::invalid_argument(std::string("scenario table lacks '") + name + "'");
  return d[name].cast<std::vector<T>>();
}

// The columns and constants every scenario table reads from Python as they are (scenario_from's and
// env_table.hpp's scenario_derived's).
void read_columns(EnvScenario& z, const py::dict& d) {
  z.P = d["P"].cast<int>();
  z.M = d["M"].cast<int>();
  const std::pair<std::vector<double>*, const char*> columns[] = {
      {&z.lf, "f"}, {&z.lb, "b"}, {&z.lw, "w"}, {&z.lact, "act"}, {&z.lkeep, "keep"}, {&z.lparams, "params"},
      {&z.lout, "out"}, {&z.speeds, "speeds"}, {&z.cspeeds, "cluster_speeds"}, {&z.lat, "latency"},
      {&z.bw, "bandwidth"}, {&z.limits, "limits"}, {&z.cost, "cost"}};
  for (const auto& [column, name] : columns) *column = vec_of<double>(d, name);
  z.L = static_cast<int>(z.lf.size());
  z.has_ws = !d["workspace"].is_none();
  if (z.has_ws) z.lws = vec_of<double>(d, "workspace");
  z.has_wws = !d["w_workspace"].is_none();
  if (z.has_wws) z.lwws = vec_of<double>(d, "w_workspace");
  z.defers = d["defers"].cast<bool>();
  z.over = d["over"].cast<double>();
  z.scale = d["scale"].cast<double>();
  z.param_bytes = d["param_bytes"].cast<double>();
  z.unit = d["unit"].cast<double>();
}

// The budget presets of a table (each a list per device, or None: unlimited).
void read_presets(EnvScenario& z, const py::dict& d) {
  const py::list presets = d["presets"].cast<py::list>();
  if (presets.size() != N_PRESETS) throw std::invalid_argument("scenario table: 5 presets");
  for (const auto& b : presets) {
    z.preset_has.push_back(!b.is_none());
    z.presets.push_back(b.is_none() ? std::vector<double>{} : b.cast<std::vector<double>>());
  }
}

std::shared_ptr<EnvScenario> scenario_from(const py::dict& d) {
  auto z = std::make_shared<EnvScenario>();
  read_columns(*z, d);
  z->post = d["post"].cast<double>();
  z->prefix = vec_of<double>(d, "prefix");
  z->act_prefix = vec_of<double>(d, "act_prefix");
  z->node = vec_of<int>(d, "node");
  z->bound = d["bound"].cast<double>();
  z->consts = vec_of<double>(d, "consts");
  z->dev_template = vec_of<float>(d, "devices");
  const py::list fams = d["families"].cast<py::list>();
  if (fams.size() != N_FAMILIES) throw std::invalid_argument("scenario table: 7 families");
  for (const auto& f : fams) {  // (placement, applies, counts for family_of)
    const py::tuple t = f.cast<py::tuple>();
    z->fam_place.push_back(t[0].cast<std::vector<int>>());
    z->fam_target.push_back(t[1].cast<bool>());
    z->fam_kind.push_back(t[2].cast<bool>());
  }
  for (const auto& kv : d["balanced"].cast<py::list>()) {
    const py::tuple t = kv.cast<py::tuple>();
    z->balanced.emplace_back(t[0].cast<std::vector<int>>(), t[1].cast<std::vector<int>>());
  }
  read_presets(*z, d);
  check_scenario(*z);
  return z;
}

#include "env_table.hpp"
#include "env_start.hpp"

class EnvCore {
 public:
  EnvCore(int n, int threads) : n_(n), threads_(std::max(1, threads)), slots_(static_cast<size_t>(std::max(n, 0))) {
    if (n < 1) throw std::invalid_argument("num_envs must be >= 1");
    const py::ssize_t N = n;
    stages_ = py::array_t<float>({N, static_cast<py::ssize_t>(EC_MAX_STAGES), static_cast<py::ssize_t>(EC_NS)});
    devices_ = py::array_t<float>({N, static_cast<py::ssize_t>(EC_MAX_DEVICES), static_cast<py::ssize_t>(EC_ND)});
    plan_ = py::array_t<float>({N, static_cast<py::ssize_t>(EC_NG)});
    masks_ = py::array_t<bool>({N, static_cast<py::ssize_t>(EC_N_ACTIONS)});
    rewards_ = py::array_t<double>(N);
    terms_ = py::array_t<bool>(N);
    truncs_ = py::array_t<bool>(N);
    kept_ = py::array_t<bool>(N);
    edits_ = py::array_t<int32_t>(N);
    itime_ = py::array_t<double>(N);
    best_itime_ = py::array_t<double>(N);
    feasible_ = py::array_t<bool>(N);
    calls_ = py::array_t<int64_t>(N);
    version_ = py::array_t<uint64_t>(N);
    best_version_ = py::array_t<uint64_t>(N);
    std::memset(stages_.mutable_data(), 0, sizeof(float) * n * EC_MAX_STAGES * EC_NS);
    std::memset(devices_.mutable_data(), 0, sizeof(float) * n * EC_MAX_DEVICES * EC_ND);
    std::memset(plan_.mutable_data(), 0, sizeof(float) * n * EC_NG);
    std::memset(masks_.mutable_data(), 0, sizeof(bool) * n * EC_N_ACTIONS);
    for (py::ssize_t i = 0; i < N; ++i) {
      rewards_.mutable_data()[i] = 0.0;
      terms_.mutable_data()[i] = truncs_.mutable_data()[i] = kept_.mutable_data()[i] = false;
      feasible_.mutable_data()[i] = false;
      edits_.mutable_data()[i] = -1;
      itime_.mutable_data()[i] = best_itime_.mutable_data()[i] = 0.0;
      calls_.mutable_data()[i] = 0;
      version_.mutable_data()[i] = best_version_.mutable_data()[i] = 0;
    }
  }

  void load(int i, const std::shared_ptr<EnvScenario>& z, const py::handle& current, const py::handle& current_result,
            const py::handle& best, const py::handle& best_result, const py::list& known, const py::dict& p) {
    slot(i);  // (its error before the arguments')
    load_start(i, start_from(z, current, current_result, best, best_result, known, p));
  }

  // Start environment i's episode from a parsed start (EnvStart: env_start.hpp).
  void load_start(int i, const EnvStart& s) {
    EnvSlot& e = slot(i);
    EnvSlot fresh;
    fresh.z = s.z;
    fresh.cur = s.cur;
    fresh.best = s.best;
    fresh.cur_r = s.cur_r;
    fresh.best_r = s.best_r;
    fresh.known.insert(s.known.begin(), s.known.end());
    fresh.calls = s.calls;
    fresh.max_calls = s.max_calls;
    fresh.calls_cap = s.calls_cap;
    fresh.calls_at_start = s.calls_at_start;
    fresh.allow_stop = s.allow_stop;
    fresh.max_steps = s.max_steps;
    fresh.step_cost = s.step_cost;
    fresh.reference = s.reference;
    fresh.start_time = s.start_time;
    fresh.version = e.version + 1;
    fresh.best_version = e.best_version + 1;
    compute_targets(fresh);
    fresh.active = true;
    e = std::move(fresh);
    write(i, e, true);
    kept_.mutable_data()[i] = false;
    edits_.mutable_data()[i] = -1;
  }

  // Start the episodes of environments `indices` (distinct) from `starts`, one each, on `threads`
  // threads without the GIL: what load_start does for each, in any order (each writes its own rows).
  void load_starts(const std::vector<int>& indices, const py::list& starts, int threads) {
    if (indices.size() != starts.size())
      throw std::invalid_argument("load_starts takes one start per environment index");
    std::vector<const EnvStart*> ptrs;
    std::vector<char> seen(n_, 0);
    for (size_t k = 0; k < indices.size(); ++k) {
      slot(indices[k]);  // (its range error)
      if (seen[indices[k]]++) throw std::invalid_argument("load_starts: environment " + std::to_string(indices[k]) +
                                                          " is named twice");
      ptrs.push_back(&starts[k].cast<const EnvStart&>());
    }
    py::gil_scoped_release nogil;
    std::atomic<size_t> next{0};
    auto worker = [&]() {
      for (size_t k = next++; k < ptrs.size(); k = next++) load_start(indices[k], *ptrs[k]);
    };
    const int width = threads >= 1 ? threads : threads_;
    const int n = ptrs.size() >= 4 ? std::min<int>(width, static_cast<int>(ptrs.size())) : 1;
    const std::function<void()> task = worker;
    BatchPool::get().run(n - 1, task);
  }

  void deactivate(int i) { slot(i).active = false; }
  bool active(int i) { return slot(i).active; }

  // One step of the environments where `which` is set; actions are checked before any runs.
  void step(const py::array& actions, const py::array& which, int threads) {
    const std::string shape = "(" + std::to_string(n_) + ",)";
    if (!actions.dtype().is(py::dtype::of<int64_t>()) || actions.ndim() != 1 || actions.shape(0) != n_)
      throw std::invalid_argument("actions must be an int64 array of shape " + shape + ", got dtype " +
                                  py::str(actions.dtype()).cast<std::string>() + " and " +
                                  std::to_string(actions.ndim()) + " dimensions");
    if (!which.dtype().is(py::dtype::of<bool>()) || which.ndim() != 1 || which.shape(0) != n_)
      throw std::invalid_argument("which must be a bool array of shape " + shape + ", got dtype " +
                                  py::str(which.dtype()).cast<std::string>() + " and " +
                                  std::to_string(which.ndim()) + " dimensions");
    const auto acts = actions.unchecked<int64_t, 1>();
    const auto sel = which.unchecked<bool, 1>();
    std::vector<int> todo;
    std::vector<int64_t> a(n_);
    for (int i = 0; i < n_; ++i) {
      a[i] = acts(i);
      if (!sel(i)) continue;
      if (!slots_[i].active) throw std::invalid_argument("environment " + std::to_string(i) + " is not loaded");
      if (a[i] < 0 || a[i] >= EC_N_ACTIONS)
        throw std::invalid_argument("action " + std::to_string(a[i]) + " of environment " + std::to_string(i) +
                                    " is outside Discrete(344)");
      todo.push_back(i);
    }
    {
      py::gil_scoped_release nogil;
      std::atomic<size_t> next{0};
      auto worker = [&]() {
        for (size_t k = next++; k < todo.size(); k = next++) step_one(todo[k], static_cast<int>(a[todo[k]]));
      };
      const int width = threads >= 1 ? threads : threads_;
      const int n = todo.size() >= 8 ? std::min<int>(width, static_cast<int>(todo.size())) : 1;
      const std::function<void()> task = worker;
      BatchPool::get().run(n - 1, task);
    }
  }

  py::tuple candidate(int i, bool best) {
    const EnvSlot& e = slot(i);
    if (!e.active) throw std::invalid_argument("environment " + std::to_string(i) + " is not loaded");
    const Cand& c = best ? e.best : e.cur;
    py::object budgets = py::none(), mpw = py::none();
    if (c.has_b) budgets = py::tuple(py::cast(c.budgets));
    if (c.mpw >= 0) mpw = py::int_(c.mpw);
    return py::make_tuple(py::tuple(py::cast(c.sizes)), py::tuple(py::cast(c.placement)), budgets, c.split, c.eager,
                          c.depth, mpw, c.count_w);
  }

  int n_;
  int threads_;
  py::array_t<float> stages_, devices_, plan_;
  py::array_t<bool> masks_, terms_, truncs_, kept_, feasible_;
  py::array_t<double> rewards_, itime_, best_itime_;
  py::array_t<int32_t> edits_;
  py::array_t<int64_t> calls_;
  py::array_t<uint64_t> version_, best_version_;

 private:
  EnvSlot& slot(int i) {
    if (i < 0 || i >= n_) throw std::out_of_range("environment index " + std::to_string(i) + " out of range");
    return slots_[i];
  }

  // PipelineEnv.step_core, then the observation, mask and info columns.
  void step_one(int i, int a) {
    EnvSlot& e = slots_[i];
    bool* mask = masks_.mutable_data() + static_cast<size_t>(i) * EC_N_ACTIONS;
    double reward;
    bool term = false, trunc = false, kept = false, changed = false;
    int edit = a;
    if (a == 0 && mask[0]) {
      reward = 0.0;
      term = true;
      edit = -1;  // stop
    } else if (!mask[a]) {
      e.steps += 1;
      e.last_kept = false;
      reward = -e.step_cost;
      trunc = e.steps >= e.max_steps;
      edit = -2;  // masked
    } else {
      const double before = env_score(e.cur_r, e.reference);
      const int k = e.target[a];
      Cand t = e.found[k];
      const std::string key = e.found_key[k];
      const auto t0 = std::chrono::steady_clock::now();
      Res res = env_evaluate(*e.z, t);
      engine_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      jobs_ += 1;
      e.calls += 1;
      e.known.insert(key);
      if (key_less(res, e.cur_r)) {
        const bool better = key_less(res, e.best_r);
        e.cur = t;
        e.cur_r = res;
        e.tried.clear();
        if (better) {
          e.best = std::move(t);
          e.best_r = std::move(res);
          e.best_version += 1;
        }
        e.version += 1;
        compute_targets(e);
        kept = changed = true;
      } else {
        e.tried.insert(key);
        bool left = false;
        for (int x = 0; x < EC_N_ACTIONS; ++x) {
          const int j = e.target[x];
          if (j >= 0 && e.found_key[j] == key) {
            e.target[x] = -1;
            e.allowed[x] = 0;
          }
          if (x > 0 && e.allowed[x]) left = true;
        }
        if (!left) e.allowed[0] = 1;
      }
      e.steps += 1;
      e.last_kept = kept;
      reward = env_score(e.cur_r, e.reference) - before - e.step_cost;
      bool any = false;
      const bool budget = e.budget_left();
      if (budget)
        for (int x = 1; x < EC_N_ACTIONS && !any; ++x) any = e.allowed[x];
      term = !any && budget;
      trunc = (e.steps >= e.max_steps || !budget) && !term;
    }
    rewards_.mutable_data()[i] = reward;
    terms_.mutable_data()[i] = term;
    truncs_.mutable_data()[i] = trunc;
    kept_.mutable_data()[i] = kept;
    edits_.mutable_data()[i] = edit;
    write(i, e, changed);
  }

  // The observation, mask and info columns of environment i (`full`: its plan changed).
  void write(int i, EnvSlot& e, bool full) {
    float* st = stages_.mutable_data() + static_cast<size_t>(i) * EC_MAX_STAGES * EC_NS;
    float* dv = devices_.mutable_data() + static_cast<size_t>(i) * EC_MAX_DEVICES * EC_ND;
    float* g = plan_.mutable_data() + static_cast<size_t>(i) * EC_NG;
    if (full) state_obs(e, st, dv, e.head, e.tail);
    int n = 0;
    for (int k = 0; k < 25; ++k) g[n++] = e.head[k];
    g[n++] = static_cast<float>(static_cast<double>(e.max_steps - e.steps) / e.max_steps);
    const double calls_left = static_cast<double>(e.calls_cap - (e.calls - e.calls_at_start)) /
                              static_cast<double>(e.calls_cap);
    g[n++] = static_cast<float>(py_max(0.0, calls_left));
    g[n++] = e.last_kept ? 1.0f : 0.0f;
    for (int k = 0; k < 5; ++k) g[n++] = e.tail[k];
    bool* mask = masks_.mutable_data() + static_cast<size_t>(i) * EC_N_ACTIONS;
    if (e.budget_left()) {
      for (int x = 0; x < EC_N_ACTIONS; ++x) mask[x] = e.allowed[x];
    } else {
      std::fill(mask, mask + EC_N_ACTIONS, false);
      mask[0] = true;
    }
    itime_.mutable_data()[i] = e.cur_r.valid ? e.cur_r.t : INF;
    best_itime_.mutable_data()[i] = e.best_r.valid ? e.best_r.t : INF;
    feasible_.mutable_data()[i] = e.cur_r.feasible;
    calls_.mutable_data()[i] = e.calls;
    version_.mutable_data()[i] = e.version;
    best_version_.mutable_data()[i] = e.best_version;
  }

  std::vector<EnvSlot> slots_;

 public:
  std::atomic<long long> engine_ns_{0}, jobs_{0};  // schedule-and-simulate time and jobs, all steps
};

void bind_env_core(py::module_& mod) {
  mod.def("balanced_split", &balanced_split, py::arg("prefix"), py::arg("stage_speeds"),
          "pipeline/balance.py's balanced_sizes from the prefix sums of the layers' f+b+w and each stage's speed.");
  mod.def(
      "env_evaluate",
      [](const py::list& pairs, int threads) {
        // (EnvScenario, candidate 8-tuple) pairs -> (iteration time, busy, peak memory) each, on `threads` threads.
        std::vector<std::shared_ptr<EnvScenario>> zs;
        std::vector<Cand> cands;
        for (const auto& item : pairs) {
          const py::tuple t = item.cast<py::tuple>();
          if (t.size() != 2) throw std::invalid_argument("env_evaluate takes (scenario table, candidate) pairs");
          auto z = t[0].cast<std::shared_ptr<EnvScenario>>();
          Cand c = cand_from(t[1]);
          check_cand(*z, c);
          zs.push_back(std::move(z));
          cands.push_back(std::move(c));
        }
        std::vector<Res> out(cands.size());
        {
          py::gil_scoped_release nogil;
          std::atomic<size_t> next{0};
          auto worker = [&]() {
            for (size_t k = next++; k < cands.size(); k = next++) out[k] = env_evaluate(*zs[k], cands[k]);
          };
          const int n = cands.size() >= 4 ? std::max(1, std::min<int>(threads, static_cast<int>(cands.size()))) : 1;
          const std::function<void()> task = worker;
          BatchPool::get().run(n - 1, task);
        }
        py::list res;
        for (const Res& r : out) res.append(py::make_tuple(r.t, py::tuple(py::cast(r.busy)), py::tuple(py::cast(r.peak))));
        return res;
      },
      py::arg("pairs"), py::arg("threads") = 1,
      "Evaluator.result's figures of candidates on their scenario tables: (iteration time, busy, peak memory).");
  mod.def(
      "env_scenario_derived",
      [](const py::dict& d) -> py::object {
        auto z = scenario_derived(d);
        return z ? py::cast(z) : py::none();
      },
      py::arg("columns"),
      "A scenario's table derived from its raw columns (env_table.hpp), or None where the Python reference "
      "builds it.");
  py::class_<EnvScenario, std::shared_ptr<EnvScenario>>(mod, "EnvScenario")
      .def(py::init(&scenario_from), "A scenario's tables for EnvCore (built by env/native_core.py).")
      .def("has_balanced", [](const EnvScenario& z, const std::vector<int>& placement) {
        return z.balanced_of(placement) != nullptr;
      })
      .def_readonly("bound", &EnvScenario::bound)
      .def_readonly("devices", &EnvScenario::P)
      .def_readonly("layers", &EnvScenario::L);
  mod.def(
      "env_portfolio_start",
      [](const std::shared_ptr<EnvScenario>& z, const std::vector<std::tuple<int, int, bool>>& picks, int repair_starts,
         py::object max_calls, int max_steps, double step_cost, bool allow_stop, double reference) -> py::object {
        if (!z) throw std::invalid_argument("env_portfolio_start needs a scenario table");
        long long calls = -1;
        if (!max_calls.is_none()) {
          calls = max_calls.cast<long long>();
          if (calls < 1) throw std::invalid_argument("max_calls must be None or >= 1");
        }
        std::vector<PortfolioPick> ps;
        for (const auto& [f, p, w] : picks) ps.push_back(PortfolioPick{f, p, w});
        EnvStart out;
        bool found;
        {
          py::gil_scoped_release nogil;
          found = portfolio_start(z, ps, repair_starts, calls, max_steps, step_cost, allow_stop, reference, out);
        }
        return found ? py::cast(std::move(out)) : py::none();
      },
      py::arg("table"), py::arg("picks"), py::arg("repair_starts"), py::arg("max_calls"), py::arg("max_steps"),
      py::arg("step_cost"), py::arg("allow_stop"), py::arg("reference"),
      "A fresh episode's portfolio start (env_start.hpp's portfolio_start), or None where no pick fits.");
  py::class_<EnvStart>(mod, "EnvStart")
      .def(py::init(&start_from), py::arg("table"), py::arg("current"), py::arg("current_result"), py::arg("best"),
           py::arg("best_result"), py::arg("known"), py::arg("params"),
           "An episode's start: EnvCore.load's arguments after the slot, parsed once (env_start.hpp).")
      .def_static("from_bytes", [](const py::bytes& b) { return start_of_bytes(std::string(b)); },
                  "The start to_bytes wrote (ValueError for other bytes).")
      .def("to_bytes", [](const EnvStart& s) { return py::bytes(start_bytes(s)); })
      .def_property_readonly("table", [](const EnvStart& s) { return s.z; })
      .def_readonly("reference", &EnvStart::reference)
      .def(py::pickle([](const EnvStart& s) { return py::bytes(start_bytes(s)); },
                      [](const py::bytes& b) { return start_of_bytes(std::string(b)); }));
  py::class_<EnvCore>(mod, "EnvCore")
      .def(py::init<int, int>(), py::arg("num_envs"), py::arg("threads"))
      .def("load", &EnvCore::load, "Start environment i's episode from the Python reset's state.")
      .def("load_start", &EnvCore::load_start, py::arg("i"), py::arg("start"),
           "Start environment i's episode from an EnvStart (what load takes, parsed once).")
      .def("load_starts", &EnvCore::load_starts, py::arg("indices"), py::arg("starts"), py::arg("threads") = 0,
           "load_start of each (distinct) index from its start, on `threads` threads (0: the core's), without "
           "the GIL.")
      .def("deactivate", &EnvCore::deactivate)
      .def("active", &EnvCore::active)
      .def("step", &EnvCore::step, py::arg("actions"), py::arg("which"), py::arg("threads") = 0,
           "Step the environments where `which` is set (their rows of the arrays), on `threads` threads (0: the "
           "core's). Releases the GIL: a Python thread may load other rows meanwhile.")
      .def("candidate", &EnvCore::candidate, "Environment i's current (or best) candidate as an 8-tuple.")
      .def_readonly("stages", &EnvCore::stages_)
      .def_readonly("devices", &EnvCore::devices_)
      .def_readonly("plan", &EnvCore::plan_)
      .def_readonly("masks", &EnvCore::masks_)
      .def_readonly("rewards", &EnvCore::rewards_)
      .def_readonly("terminated", &EnvCore::terms_)
      .def_readonly("truncated", &EnvCore::truncs_)
      .def_readonly("kept", &EnvCore::kept_)
      .def_readonly("edits", &EnvCore::edits_)
      .def_readonly("iteration_time", &EnvCore::itime_)
      .def_readonly("best_iteration_time", &EnvCore::best_itime_)
      .def_readonly("feasible", &EnvCore::feasible_)
      .def_readonly("sim_calls", &EnvCore::calls_)
      .def_readonly("version", &EnvCore::version_)
      .def_readonly("best_version", &EnvCore::best_version_)
      .def_property_readonly("engine_seconds", [](const EnvCore& c) { return c.engine_ns_.load() * 1e-9; })
      .def_property_readonly("engine_jobs", [](const EnvCore& c) { return c.jobs_.load(); });
}
