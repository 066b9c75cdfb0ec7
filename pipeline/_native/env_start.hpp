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
