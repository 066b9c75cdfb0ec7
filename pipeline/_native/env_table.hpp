// A scenario's table derived in the engine from its raw columns (issue 45): what env/native_core.py's
// table_fields reads off a PipelineEnv preparation (env/pipeline_env.py's _Prep: prefix sums, the
// lower bound, the observation's constants and device rows, the DP-balanced split of each placement
// family), computed here from the profile's and cluster's own numbers, so that a reset worker needs
// no preparation for a portfolio start. Included by env_core.hpp after scenario_from; the same table,
// field for field: tests/env/test_env_table.py compares the starts made from both, byte for byte.
//
// Sums follow what the Python reference runs: Python's sum() and itertools.accumulate add in order
// (CPython 3.11), numpy's sum and mean add pairwise (np_sum).

// Python's sum() of floats (in order, from 0).
inline double py_sum(const std::vector<double>& xs) {
  double r = 0.0;
  for (double x : xs) r += x;
  return r;
}

// env/native_core.py's _exact: every partial sum of |x| below 2**53.
inline bool exact_column(const std::vector<double>& xs) {
  double r = 0.0;
  for (double x : xs) r += std::fabs(x);
  return r < 9007199254740992.0;
}

// pipeline/bounds.py's lower_bound(profile, cluster, M, packing=False).value for a profile without
// measured backward columns: back = b + w, grad = b (``speeds``, ``over``: the ideal runtime's).
double derived_bound(const EnvScenario& z, const std::vector<double>& speeds, double over) {
  const size_t L = z.lf.size();
  std::vector<double> back(L), per_mb(L);
  double heaviest_mb = 0.0, tail = 0.0;
  for (size_t k = 0; k < L; ++k) {
    back[k] = z.lb[k] + z.lw[k];
    per_mb[k] = z.lf[k] + back[k];
    heaviest_mb = k == 0 ? per_mb[k] : py_max(heaviest_mb, per_mb[k]);
    const double gap = back[k] - z.lb[k];
    tail = k == 0 ? gap : py_min(tail, gap);
  }
  double fastest = speeds[0];
  for (double s : speeds) fastest = py_max(fastest, s);
  const double M = static_cast<double>(z.M);
  const double work = M * py_sum(per_mb) / py_sum(speeds) + 3.0 * over * M;
  const double heaviest = M * heaviest_mb / fastest + 3.0 * over * M;
  const double chain = (py_sum(z.lf) + py_sum(z.lb) + tail) / fastest + 3.0 * over;
  return py_max(py_max(py_max(py_max(work, heaviest), chain), 0.0), 0.0);  // (critical layer, packing: 0)
}

// The table of `d` (env/native_core.py's direct_table builds it), or nullptr where table_fields gives
// None (a byte or parameter column whose sums are not exact in doubles) or a balanced split is left to
// the Python reference (balanced_split's own refusals).
std::shared_ptr<EnvScenario> scenario_derived(const py::dict& d) {
  auto z = std::make_shared<EnvScenario>();
  read_columns(*z, d);
  if (!exact_column(z->lact) || !exact_column(z->lkeep) || !exact_column(z->lparams) || !exact_column(z->lout))
    return nullptr;
  z->post = 0.0;
  const int P = z->P, L = z->L;
  const int gpn = d["gpus_per_node"].cast<int>();
  const size_t l = static_cast<size_t>(L), p = static_cast<size_t>(P);
  if (P < 1 || P > EC_MAX_DEVICES || L < 1 || gpn < 1 || z->cost.size() != l || z->lb.size() != l ||
      z->lw.size() != l || z->lact.size() != l || z->cspeeds.size() != p || z->limits.size() != p)
    throw std::invalid_argument("scenario columns: 1..32 devices, one cost (f, b, w, act) per layer, one speed "
                                "and limit per device");
  // _Prep's prefix sums (accumulate from 0.0), nodes, constants and device rows
  z->prefix.assign(1, 0.0);
  z->act_prefix.assign(1, 0.0);
  for (int k = 0; k < L; ++k) {
    z->prefix.push_back(z->prefix.back() + z->cost[k]);
    z->act_prefix.push_back(z->act_prefix.back() + z->lact[k]);
  }
  for (int x = 0; x < P; ++x) z->node.push_back(x / gpn);
  const int nodes = z->node.back() + 1;
  const double total = py_max(np_sum(z->cost.data(), L), 1e-12);
  const double mean_limit = np_sum(z->limits.data(), P) / P, mean_speed = np_sum(z->cspeeds.data(), P) / P;
  double top = z->cspeeds[0], bottom = z->cspeeds[0];
  for (double s : z->cspeeds) {
    top = s > top ? s : top;  // (numpy's max and min of finite speeds)
    bottom = s < bottom ? s : bottom;
  }
  const double stat = py_sum(z->lparams) * d["bytes_per_param"].cast<double>() / P;
  z->consts = {d["comm"].cast<double>() / z->unit / total, z->cost[L - 1] / total, stat / mean_limit,
               nodes > 1 ? 1.0 : 0.0, top / bottom - 1.0};
  z->dev_template.assign(static_cast<size_t>(EC_MAX_DEVICES) * EC_ND, 0.0f);
  const double node_scale = static_cast<double>(std::max(1, nodes - 1));
  for (int x = 0; x < P; ++x) {
    float* row = z->dev_template.data() + static_cast<size_t>(x) * EC_ND;
    row[0] = 1.0f;
    row[5] = static_cast<float>(z->cspeeds[x] / mean_speed);
    row[9] = static_cast<float>(static_cast<double>(z->node[x]) / node_scale);
    row[10] = static_cast<float>(z->limits[x] / mean_limit);
  }
  z->bound = derived_bound(*z, vec_of<double>(d, "bound_speeds"), d["bound_over"].cast<double>());
  // the placement families and their DP-balanced splits (table_fields' loop, by the cluster's speeds)
  const py::list fams = d["families"].cast<py::list>();
  if (fams.size() != N_FAMILIES) throw std::invalid_argument("scenario columns: 7 families");
  const int stages = std::min(L, EC_MAX_STAGES);
  for (const auto& f : fams) {  // (placement, chunks, the kind fits the devices)
    const py::tuple t = f.cast<py::tuple>();
    std::vector<int> placement = t[0].cast<std::vector<int>>();
    const int chunks = t[1].cast<int>();
    const bool kind_ok = t[2].cast<bool>();
    const bool applies = kind_ok && P * chunks <= stages;
    if (applies && z->balanced_of(placement) == nullptr) {
      std::vector<double> sp;
      for (int x : placement) {
        if (x < 0 || x >= P) throw std::invalid_argument("scenario columns: a family placement names a device outside");
        sp.push_back(z->cspeeds[x]);
      }
      try {
        z->balanced.emplace_back(placement, balanced_split(z->prefix, sp));
      } catch (const std::invalid_argument&) {
        return nullptr;  // (the Python reference's own cases)
      }
    }
    z->fam_place.push_back(std::move(placement));
    z->fam_target.push_back(applies);
    z->fam_kind.push_back(kind_ok);
  }
  read_presets(*z, d);
  check_scenario(*z);
  return z;
}
