// An episode's start for the batched environment's core, parsed once and pickled as bytes.
//
// Included by env_core.hpp (inside engine.cpp's anonymous namespace) after the scenario table and
// before EnvCore. EnvStart holds what EnvCore.load takes (the scenario table, the current and best
// candidates and their results, the candidates the start evaluated, the episode's counters),
// parsed from Python once. It pickles to a flat byte string and back (a reset worker process,
// env/reset_worker.py, prepares starts and sends them; the stepping process loads one with a
// copy instead of converting Python lists and tuples, about 0.1 ms a reset). The bytes hold every
// double as its 8 bytes, so a start read back is the start written, bit for bit; malformed bytes
// raise ValueError, never read out of bounds.

struct EnvStart {
  std::shared_ptr<EnvScenario> z;
  Cand cur, best;
  Res cur_r, best_r;
  std::vector<std::string> known;  // the evaluated candidates' keys (Cand::key)
  long long calls = 0, max_calls = -1, calls_cap = 1, calls_at_start = 0;
  bool allow_stop = true;
  int max_steps = 24;
  double step_cost = 0.002, reference = 1.0, start_time = INF;
};

// EnvCore.load's arguments after the slot (see env/native_core.py's load_args), checked.
EnvStart start_from(const std::shared_ptr<EnvScenario>& z, const py::handle& current, const py::handle& current_result,
                    const py::handle& best, const py::handle& best_result, const py::list& known, const py::dict& p) {
  if (!z) throw std::invalid_argument("an episode's start needs a scenario table");
  EnvStart s;
  s.z = z;
  s.cur = cand_from(current);
  s.best = cand_from(best);
  check_cand(*z, s.cur);
  check_cand(*z, s.best);
  s.cur_r = res_from(current_result, z->P);
  s.best_r = res_from(best_result, z->P);
  s.known.reserve(known.size());
  for (const auto& k : known) s.known.push_back(cand_from(k).key());
  s.calls = p["calls"].cast<long long>();
  s.max_calls = p["max_calls"].is_none() ? -1 : p["max_calls"].cast<long long>();
  s.calls_cap = p["calls_cap"].cast<long long>();
  s.calls_at_start = p["calls_at_start"].cast<long long>();
  s.allow_stop = p["allow_stop"].cast<bool>();
  s.max_steps = p["max_steps"].cast<int>();
  s.step_cost = p["step_cost"].cast<double>();
  s.reference = p["reference"].cast<double>();
  s.start_time = p["start_time"].cast<double>();
  if (s.max_steps < 1 || s.calls_cap < 1) throw std::invalid_argument("max_steps and calls_cap must be >= 1");
  return s;
}

// ------------------------------------------------------------------ bytes

constexpr uint32_t ES_MAGIC = 0x31535045;  // "EPS1": the layout below, version 1

class ByteWriter {
 public:
  std::string out;
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    out.append(reinterpret_cast<const char*>(v.data()), sizeof(T) * v.size());
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    out.append(s);
  }
};

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> vec() {
    const uint64_t n = pod<uint64_t>();
    if (n > static_cast<uint64_t>(end_ - p_) / sizeof(T)) bad();
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p_, sizeof(T) * n);
    p_ += sizeof(T) * n;
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  bool flag() { return pod<char>() != 0; }
  bool done() const { return p_ == end_; }

 private:
  void need(uint64_t n) const {
    if (n > static_cast<uint64_t>(end_ - p_)) bad();
  }
  [[noreturn]] static void bad() { throw std::invalid_argument("an episode start's bytes are truncated or malformed"); }
  const char* p_;
  const char* end_;
};

void put_cand(ByteWriter& w, const Cand& c) {
  w.vec(c.sizes);
  w.vec(c.placement);
  w.pod<char>(c.has_b);
  w.vec(c.budgets);
  w.pod<char>(c.split);
  w.pod<char>(c.eager);
  w.pod<char>(c.depth);
  w.pod<char>(c.count_w);
  w.pod<int32_t>(c.mpw);
}

Cand get_cand(ByteReader& r) {
  Cand c;
  c.sizes = r.vec<int>();
  c.placement = r.vec<int>();
  c.has_b = r.flag();
  c.budgets = r.vec<double>();
  c.split = r.flag();
  c.eager = r.flag();
  c.depth = r.flag();
  c.count_w = r.flag();
  c.mpw = r.pod<int32_t>();
  if (c.sizes.size() != c.placement.size() || c.sizes.empty() || c.sizes.size() > EC_MAX_STAGES)
    throw std::invalid_argument("an episode start's candidate needs 1..128 stages, one device each");
  if (!c.has_b && !c.budgets.empty()) throw std::invalid_argument("an episode start's candidate is malformed");
  return c;
}

void put_res(ByteWriter& w, const Res& x) {
  w.pod<char>(x.valid);
  w.pod<char>(x.feasible);
  w.pod<int32_t>(x.cls);
  w.pod(x.over);
  w.pod(x.t);
  w.vec(x.busy);
  w.vec(x.peak);
  w.vec(x.limit);
}

Res get_res(ByteReader& r, int P) {
  Res x;
  x.valid = r.flag();
  x.feasible = r.flag();
  x.cls = r.pod<int32_t>();
  x.over = r.pod<double>();
  x.t = r.pod<double>();
  x.busy = r.vec<double>();
  x.peak = r.vec<double>();
  x.limit = r.vec<double>();
  if (static_cast<int>(x.busy.size()) != P || static_cast<int>(x.peak.size()) != P ||
      static_cast<int>(x.limit.size()) != P || x.cls < 0 || x.cls > 2)
    throw std::invalid_argument("an episode start's result needs one busy time, peak and limit per device");
  return x;
}

void put_scenario(ByteWriter& w, const EnvScenario& z) {
  w.pod<int32_t>(z.P);
  w.pod<int32_t>(z.M);
  for (const auto* v : {&z.lf, &z.lb, &z.lw, &z.lact, &z.lkeep, &z.lparams, &z.lout, &z.lws, &z.lwws}) w.vec(*v);
  w.pod<char>(z.has_ws);
  w.pod<char>(z.has_wws);
  w.pod<char>(z.defers);
  for (double x : {z.over, z.scale, z.param_bytes, z.unit, z.post, z.bound}) w.pod(x);
  for (const auto* v : {&z.speeds, &z.cspeeds, &z.lat, &z.bw, &z.limits, &z.prefix, &z.cost, &z.act_prefix, &z.consts})
    w.vec(*v);
  w.vec(z.node);
  w.vec(z.dev_template);
  w.pod<uint64_t>(z.fam_place.size());
  for (const auto& f : z.fam_place) w.vec(f);
  w.vec(z.fam_target);
  w.vec(z.fam_kind);
  w.pod<uint64_t>(z.balanced.size());
  for (const auto& kv : z.balanced) {
    w.vec(kv.first);
    w.vec(kv.second);
  }
  w.vec(z.preset_has);
  w.pod<uint64_t>(z.presets.size());
  for (const auto& b : z.presets) w.vec(b);
}

std::shared_ptr<EnvScenario> get_scenario(ByteReader& r) {
  auto z = std::make_shared<EnvScenario>();
  z->P = r.pod<int32_t>();
  z->M = r.pod<int32_t>();
  for (auto* v : {&z->lf, &z->lb, &z->lw, &z->lact, &z->lkeep, &z->lparams, &z->lout, &z->lws, &z->lwws})
    *v = r.vec<double>();
  z->L = static_cast<int>(z->lf.size());
  z->has_ws = r.flag();
  z->has_wws = r.flag();
  z->defers = r.flag();
  for (double* x : {&z->over, &z->scale, &z->param_bytes, &z->unit, &z->post, &z->bound}) *x = r.pod<double>();
  for (auto* v : {&z->speeds, &z->cspeeds, &z->lat, &z->bw, &z->limits, &z->prefix, &z->cost, &z->act_prefix,
                  &z->consts})
    *v = r.vec<double>();
  z->node = r.vec<int>();
  z->dev_template = r.vec<float>();
  const uint64_t families = r.pod<uint64_t>();
  if (families != N_FAMILIES) throw std::invalid_argument("an episode start's table: 7 families");
  for (uint64_t k = 0; k < families; ++k) z->fam_place.push_back(r.vec<int>());
  z->fam_target = r.vec<char>();
  z->fam_kind = r.vec<char>();
  const uint64_t balanced = r.pod<uint64_t>();
  if (balanced > N_FAMILIES) throw std::invalid_argument("an episode start's table: too many balanced splits");
  for (uint64_t k = 0; k < balanced; ++k) {
    auto placement = r.vec<int>();
    auto sizes = r.vec<int>();
    z->balanced.emplace_back(std::move(placement), std::move(sizes));
  }
  z->preset_has = r.vec<char>();
  const uint64_t presets = r.pod<uint64_t>();
  if (presets != N_PRESETS) throw std::invalid_argument("an episode start's table: 5 presets");
  for (uint64_t k = 0; k < presets; ++k) z->presets.push_back(r.vec<double>());
  if (z->fam_target.size() != N_FAMILIES || z->fam_kind.size() != N_FAMILIES || z->preset_has.size() != N_PRESETS)
    throw std::invalid_argument("an episode start's table: 7 families and 5 presets");
  for (int k = 0; k < N_PRESETS; ++k)
    if (!z->preset_has[k] && !z->presets[k].empty()) throw std::invalid_argument("an episode start's table: a preset");
  check_scenario(*z);
  return z;
}

std::string start_bytes(const EnvStart& s) {
  ByteWriter w;
  w.pod(ES_MAGIC);
  put_scenario(w, *s.z);
  put_cand(w, s.cur);
  put_cand(w, s.best);
  put_res(w, s.cur_r);
  put_res(w, s.best_r);
  w.pod<uint64_t>(s.known.size());
  for (const auto& k : s.known) w.str(k);
  for (long long x : {s.calls, s.max_calls, s.calls_cap, s.calls_at_start}) w.pod<int64_t>(x);
  w.pod<char>(s.allow_stop);
  w.pod<int32_t>(s.max_steps);
  for (double x : {s.step_cost, s.reference, s.start_time}) w.pod(x);
  return std::move(w.out);
}

EnvStart start_of_bytes(const std::string& bytes) {
  ByteReader r(bytes.data(), bytes.size());
  if (r.pod<uint32_t>() != ES_MAGIC)
    throw std::invalid_argument("not an episode start's bytes (or of another build's layout)");
  EnvStart s;
  s.z = get_scenario(r);
  s.cur = get_cand(r);
  s.best = get_cand(r);
  check_cand(*s.z, s.cur);
  check_cand(*s.z, s.best);
  s.cur_r = get_res(r, s.z->P);
  s.best_r = get_res(r, s.z->P);
  const uint64_t known = r.pod<uint64_t>();
  for (uint64_t k = 0; k < known; ++k) s.known.push_back(r.str());
  s.calls = r.pod<int64_t>();
  s.max_calls = r.pod<int64_t>();
  s.calls_cap = r.pod<int64_t>();
  s.calls_at_start = r.pod<int64_t>();
  s.allow_stop = r.flag();
  s.max_steps = r.pod<int32_t>();
  s.step_cost = r.pod<double>();
  s.reference = r.pod<double>();
  s.start_time = r.pod<double>();
  if (!r.done()) throw std::invalid_argument("an episode start's bytes are longer than its layout");
  if (s.max_steps < 1 || s.calls_cap < 1 || s.max_calls < -1)
    throw std::invalid_argument("an episode start's max_steps, calls_cap or max_calls is out of range");
  return s;
}

// ------------------------------------------------------------------ the portfolio's start

// One of the portfolio's starting plans (env/editor.py's PORTFOLIO_PICKS): a placement family, a
// budget preset (both indices into the scenario table's), and whether W counts against the budget
// (pipeline/start_recipes.py's preset_candidate: not under ZB-H1's and ZB-H2's, which keep at
// most one W pending per device instead).
struct PortfolioPick {
  int family, preset;
  bool counts_w;
};

// The start of a fresh episode of scenario z from the portfolio, as the Python reference makes it
// (PipelineEnv.reset_rounds with a new evaluator, PlanEditor.starting over portfolio(), then
// env/native_core.py's load_args): each pick that fits the scenario at its DP-balanced split,
// evaluated in turn while calls are left (the first whatever is left); the best by objective_key;
// the `repair_starts` fastest that overflow memory with their budgets cut to fit (fit_memory),
// evaluated while calls are left, kept where strictly better. max_calls -1: none. False where no
// pick fits (the reference raises; the caller runs it). The results are the compiled engine's own
// (env_evaluate), so the start is the one EnvStart parses from the Python reset, bit for bit
// (tests/env/test_env_start.py compares their bytes).
bool portfolio_start(const std::shared_ptr<EnvScenario>& zp, const std::vector<PortfolioPick>& picks,
                     int repair_starts, long long max_calls, int max_steps, double step_cost, bool allow_stop,
                     double reference, EnvStart& out) {
  if (max_steps < 1) throw std::invalid_argument("max_steps must be >= 1");
  const EnvScenario& z = *zp;
  std::vector<Cand> cands;
  for (const PortfolioPick& p : picks) {
    if (p.family < 0 || p.family >= N_FAMILIES || p.preset < 0 || p.preset >= N_PRESETS)
      throw std::invalid_argument("a portfolio pick names a family (0..6) and a preset (0..4)");
    if (!z.fam_target[p.family]) continue;  // portfolio(): more stages than layers, or chunks on one device
    Cand c;
    c.placement = z.fam_place[p.family];
    c.sizes = *z.balanced_of(c.placement);  // (check_scenario: a family that applies has its split)
    c.has_b = z.preset_has[p.preset];
    c.budgets = z.presets[p.preset];
    c.count_w = p.counts_w;
    c.mpw = p.counts_w ? -1 : z.P;
    cands.push_back(std::move(c));
  }
  if (cands.empty()) return false;
  // The episode's evaluator: a result per distinct candidate, numbered by the call that made it.
  std::unordered_map<std::string, std::pair<Res, long long>> memo;
  std::vector<std::string> order;
  auto result = [&](const Cand& c) -> const std::pair<Res, long long>& {
    std::string key = c.key();
    auto hit = memo.find(key);
    if (hit != memo.end()) return hit->second;
    order.push_back(key);
    const long long number = static_cast<long long>(order.size());
    return memo.emplace(std::move(key), std::make_pair(env_evaluate(z, c), number)).first->second;
  };
  auto left = [&](long long calls) { return max_calls < 0 || calls < max_calls; };
  long long calls = 0;
  const Cand* best = nullptr;
  Res best_r;
  std::vector<std::pair<double, size_t>> over;  // (iteration time, index) of those that overflow memory
  for (size_t k = 0; k < cands.size(); ++k) {
    if (best != nullptr && !left(calls)) break;
    const auto& [res, number] = result(cands[k]);
    calls = std::max(calls, number);
    if (res.valid && !res.feasible) over.emplace_back(res.t, k);
    if (best == nullptr || key_less(res, best_r)) {
      best = &cands[k];
      best_r = res;
    }
  }
  std::stable_sort(over.begin(), over.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (static_cast<int>(over.size()) > repair_starts) over.resize(static_cast<size_t>(std::max(0, repair_starts)));
  std::vector<Cand> repairs;
  for (const auto& [t, k] : over) {
    Cand fixed;
    if (fit_memory_of(z, cands[k], result(cands[k]).first, fixed)) repairs.push_back(std::move(fixed));
  }
  Cand chosen = *best;
  for (const Cand& fixed : repairs) {
    if (!left(calls)) continue;
    const auto& [res, number] = result(fixed);
    calls = std::max(calls, number);
    if (key_less(res, best_r)) {
      chosen = fixed;
      best_r = res;
    }
  }
  const long long evaluated = static_cast<long long>(order.size());
  out = EnvStart{};
  out.z = zp;
  out.cur = chosen;
  out.best = std::move(chosen);
  out.cur_r = best_r;
  out.best_r = std::move(best_r);
  out.known = std::move(order);
  out.calls = evaluated;
  out.max_calls = max_calls;
  out.calls_cap = std::max(1LL, (max_calls > 0 ? max_calls : static_cast<long long>(max_steps) + 10) - evaluated);
  out.calls_at_start = evaluated;
  out.allow_stop = allow_stop;
  out.max_steps = max_steps;
  out.step_cost = step_cost;
  out.reference = reference;
  out.start_time = out.cur_r.t;
  return true;
}
