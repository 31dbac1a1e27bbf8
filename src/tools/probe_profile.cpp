// The hardware profile `kvserve probe` writes and every command reads:
// its accessors, JSON out and in (older profiles without the optional
// parts still load), the file, and the printout.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "tools/probe.h"
#include "tools/units.h"

namespace kvs::tools {

const KernelPoint* KernelRate::at(int n) const {
  for (const auto& k : points)
    if (k.n == n) return &k;
  return nullptr;
}

const KernelPoint* KernelRate::nearest(double n) const {
  const KernelPoint* best = nullptr;
  double best_d = 0;
  for (const auto& k : points) {
    const double d = std::fabs(std::log(double(k.n)) - std::log(std::max(1.0, n)));
    if (!best || d < best_d - 1e-12) best = &k, best_d = d;
  }
  return best;
}

const KernelRate* HardwareProfile::kernel(const std::string& type) const {
  const std::string l = lower_ascii(type);
  for (const auto& k : kernels)
    if (k.type == l) return &k;
  return nullptr;
}

namespace {

nlohmann::json points_json(const std::vector<RatePoint>& v, const char* key) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : v) a.push_back({{"threads", p.threads}, {key, p.rate}});
  return a;
}

std::vector<RatePoint> points_from(const nlohmann::json& a, const char* key) {
  std::vector<RatePoint> v;
  for (const auto& e : a) v.push_back({e.at("threads").get<int>(), e.at(key).get<double>()});
  return v;
}

// The tile peaks: measured only where their tiles run, absent elsewhere
// and in older profiles.
bool optional_peak(const HardwareProfile& p, const PeakRate* r) {
  return r == &p.int8_amx || r == &p.bf16_amx || r == &p.fp32_amx;
}
// Every peak under its profile key, in the order the profile prints them.
template <class P>  // HardwareProfile or const HardwareProfile
auto named_peaks(P& p) {
  using R = decltype(&p.fp32);
  return std::array<std::pair<const char*, R>, 6>{{{"fp32", &p.fp32},
                                                   {"bf16", &p.bf16},
                                                   {"int8", &p.int8},
                                                   {"int8_amx", &p.int8_amx},
                                                   {"bf16_amx", &p.bf16_amx},
                                                   {"fp32_amx", &p.fp32_amx}}};
}
}  // namespace

nlohmann::json profile_to_json(const HardwareProfile& p) {
  nlohmann::json flops;
  for (auto [name, r] : named_peaks(p))
    if (r->peak > 0 || !optional_peak(p, r))
      flops[name] = {{"isa", r->isa}, {"peak_ops_per_s", r->peak}, {"by_threads", points_json(r->by_threads, "ops_per_s")}};
  nlohmann::json j = {{"kvserve_profile", 1},
                      {"cpu", p.cpu},
                      {"logical_cores", p.logical_cores},
                      {"mem_total_bytes", p.mem_total_bytes},
                      {"bandwidth",
                       {{"read_bytes_per_s", p.bandwidth},
                        {"buffer_bytes", p.buffer_bytes},
                        {"by_threads", points_json(p.bandwidth_by_threads, "bytes_per_s")}}},
                      {"flops", flops},
                      {"created", p.created}};
  if (!p.kernels.empty()) {
    nlohmann::json types = nlohmann::json::object();
    for (const auto& k : p.kernels) {
      nlohmann::json pts = nlohmann::json::array();
      for (const auto& q : k.points)
        pts.push_back({{"n", q.n}, {"ops_per_s", q.ops_per_s}, {"weight_bytes_per_s", q.weight_bytes_per_s}});
      types[k.type] = pts;
    }
    j["matmul"] = {{"threads", p.kernel_threads},
                   {"rows", p.kernel_rows},
                   {"cols", p.kernel_cols},
                   {"buffer_bytes", p.kernel_buffer_bytes},
                   {"types", types}};
  }
  if (!p.decode.empty()) j["decode_variants"] = decode_choices_to_json(p.decode);
  if (!p.amx.empty()) j["amx_tiles"] = amx_choices_to_json(p.amx);
  if (p.attention.ops_per_s > 0)
    j["attention"] = {{"ctx", p.attention.ctx}, {"threads", p.attention.threads}, {"ops_per_s", p.attention.ops_per_s}};
  return j;
}

HardwareProfile profile_from_json(const nlohmann::json& j) {
  HardwareProfile p;
  try {
    if (j.at("kvserve_profile").get<int>() != 1) throw std::invalid_argument("unsupported profile version");
    p.cpu = j.value("cpu", "");
    p.logical_cores = j.value("logical_cores", 0);
    p.mem_total_bytes = j.at("mem_total_bytes").get<uint64_t>();
    const auto& bw = j.at("bandwidth");
    p.bandwidth = bw.at("read_bytes_per_s").get<double>();
    p.buffer_bytes = bw.value("buffer_bytes", uint64_t(0));
    if (bw.contains("by_threads")) p.bandwidth_by_threads = points_from(bw["by_threads"], "bytes_per_s");
    for (auto [name, r] : named_peaks(p)) {
      if (optional_peak(p, r) && !j.at("flops").contains(name)) continue;  // machines without AMX
      const auto& e = j.at("flops").at(name);
      r->isa = e.value("isa", "");
      r->peak = e.at("peak_ops_per_s").get<double>();
      if (e.contains("by_threads")) r->by_threads = points_from(e["by_threads"], "ops_per_s");
    }
    p.created = j.value("created", "");
    if (j.contains("attention")) {  // optional: older profiles have no attention rate
      const auto& a = j.at("attention");
      p.attention.ctx = a.value("ctx", 0);
      p.attention.threads = a.value("threads", 0);
      p.attention.ops_per_s = a.at("ops_per_s").get<double>();
      if (!(p.attention.ops_per_s > 0))
        throw std::invalid_argument("malformed hardware profile: attention.ops_per_s must be positive");
    }
    if (j.contains("decode_variants")) p.decode = decode_choices_from_json(j.at("decode_variants"));  // optional
    if (j.contains("amx_tiles")) p.amx = amx_choices_from_json(j.at("amx_tiles"));  // optional
    if (j.contains("matmul")) {  // optional: older profiles have no kernel rates
      const auto& m = j.at("matmul");
      p.kernel_threads = m.value("threads", 0);
      p.kernel_rows = m.value("rows", int64_t(0));
      p.kernel_cols = m.value("cols", int64_t(0));
      p.kernel_buffer_bytes = m.value("buffer_bytes", uint64_t(0));
      for (const auto& [name, pts] : m.at("types").items()) {
        KernelRate k;
        k.type = lower_ascii(name);
        for (const auto& e : pts) {
          KernelPoint q;
          q.n = e.at("n").get<int>();
          q.ops_per_s = e.at("ops_per_s").get<double>();
          q.weight_bytes_per_s = e.at("weight_bytes_per_s").get<double>();
          if (q.n < 1 || !(q.ops_per_s > 0) || !(q.weight_bytes_per_s > 0))
            throw std::invalid_argument("malformed hardware profile: matmul." + name + " needs n >= 1 and positive rates");
          k.points.push_back(q);
        }
        std::sort(k.points.begin(), k.points.end(), [](const KernelPoint& a, const KernelPoint& b) { return a.n < b.n; });
        p.kernels.push_back(std::move(k));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("malformed hardware profile: ") + e.what());
  }
  if (!(p.bandwidth > 0)) throw std::invalid_argument("malformed hardware profile: bandwidth must be positive");
  return p;
}

void save_profile(const HardwareProfile& p, const std::string& path) {
  const std::filesystem::path fp(path);
  if (fp.has_parent_path()) std::filesystem::create_directories(fp.parent_path());
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write hardware profile '" + path + "'");
  f << profile_to_json(p).dump(2) << '\n';
  if (!f.flush()) throw std::runtime_error("error writing hardware profile '" + path + "'");
}

HardwareProfile load_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read hardware profile '" + path + "' (run `kvserve probe` to create it)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    // The library's text names its own exception ids; the byte is what helps.
    throw std::runtime_error("'" + path + "' is not a hardware profile: not JSON (at byte " + std::to_string(e.byte) +
                             "); write one with `kvserve probe -o " + path + "`");
  }
  try {
    return profile_from_json(j);
  } catch (const std::exception& e) {
    throw std::runtime_error("hardware profile '" + path + "': " + e.what() + " (write a new one with `kvserve probe`)");
  }
}

std::string default_profile_path() {
  if (const char* e = std::getenv("KVS_PROFILE"); e && *e) return e;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return std::string(x) + "/kvserve/profile.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.config/kvserve/profile.json";
  return "kvserve-profile.json";
}

std::string format_profile(const HardwareProfile& p) {
  std::ostringstream o;
  o << "cpu:            " << p.cpu << " (" << p.logical_cores << " logical cores)\n";
  o << "memory:         " << format_bytes(double(p.mem_total_bytes)) << "\n";
  o << "read bandwidth: " << format_si(p.bandwidth, "B/s") << " (" << format_bytes(double(p.buffer_bytes))
    << " buffer)\n";
  for (const auto& r : p.bandwidth_by_threads)
    o << "  " << r.threads << " thread(s): " << format_si(r.rate, "B/s") << "\n";
  for (auto [name, r] : named_peaks(p)) {
    if (optional_peak(p, r) && !(r->peak > 0)) continue;
    o << name << (optional_peak(p, r) ? " peak:  " : " peak:      ") << format_si(r->peak, "OP/s") << "  [" << r->isa << "]\n";
    for (const auto& t : r->by_threads) o << "  " << t.threads << " thread(s): " << format_si(t.rate, "OP/s") << "\n";
  }
  if (!p.kernels.empty()) {
    o << "matmul (kvs::matmul, " << p.kernel_rows << "x" << p.kernel_cols << " weights cycled over "
      << format_bytes(double(p.kernel_buffer_bytes)) << ", " << p.kernel_threads << " thread(s)):\n";
    for (const auto& k : p.kernels) {
      o << "  " << k.type << ":";
      for (const auto& q : k.points)
        o << "  n=" << q.n << " " << format_si(q.ops_per_s, "OP/s") << " / " << format_si(q.weight_bytes_per_s, "B/s");
      o << "\n";
    }
  }
  if (!p.decode.empty()) {
    o << "decode kernel variants (" << p.decode.isa << ", fastest of " << decode_variants().size() << "):\n";
    for (const DecodeChoice& d : p.decode.types)
      o << "  " << d.type << ": " << to_string(d.variant) << ", " << format_ratio(d.gain) << " the default\n";
  }
  o << format_amx(p);
  if (p.attention.ops_per_s > 0)
    o << "decode attention (f32 KV, ctx " << p.attention.ctx << ", " << p.attention.threads
      << " thread(s)): " << format_si(p.attention.ops_per_s, "OP/s") << "\n";
  return o.str();
}

}  // namespace kvs::tools
