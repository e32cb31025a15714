// Energy accounting and readers: the wrap-around arithmetic, labels, the meter, RAPL against fake
// sysfs trees (wrap-around and permission errors included), NVML against a fake libnvidia-ml.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>

#include "dra/energy/energy.hpp"
#include "dra/energy/readers.hpp"

using namespace dra::energy;
namespace fs = std::filesystem;

namespace {
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("dra_energy_" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}
void zone(const fs::path& root, const std::string& dir, const std::string& name, unsigned long long uj,
          unsigned long long range) {
  write(root / dir / "name", name);
  write(root / dir / "energy_uj", std::to_string(uj));
  write(root / dir / "max_energy_range_uj", std::to_string(range));
}
}  // namespace

TEST_CASE("energy.unwrapper.counts_across_one_wrap") {
  counter_unwrapper c(1000);
  CHECK(c.update(900) == 0);
  CHECK(c.update(950) == 50);
  CHECK(c.update(20) == 50 + 50 + 20);  // 950 -> 1000 -> 0 -> 20
  CHECK(c.wraps() == 1);
  CHECK(c.update(20) == 120);
}

TEST_CASE("energy.unwrapper.unknown_range_backwards_counts_nothing") {
  counter_unwrapper c(0);
  c.update(500);
  CHECK(c.update(100) == 0);
  CHECK(c.resets() == 1);
  CHECK(c.update(150) == 50);
}

TEST_CASE("energy.labels.combine_to_the_weakest") {
  CHECK(combine(energy_source::measured, energy_source::measured) == energy_source::measured);
  CHECK(combine(energy_source::measured, energy_source::estimated) == energy_source::estimated);
  CHECK(combine(energy_source::replayed, energy_source::measured) == energy_source::replayed);
  CHECK(std::string(to_string(energy_source::estimated)) == "estimated");
}

TEST_CASE("energy.cpu_model.cpu_seconds_times_watts_per_core") {
  double clock = 5.0;
  cpu_model_reader r([&] { return clock; }, cpu_model_config{12.5});
  CHECK(r.source() == energy_source::estimated);
  CHECK(r.read_joules() == doctest::Approx(0.0));
  clock = 7.0;
  CHECK(r.read_joules() == doctest::Approx(25.0));
  CHECK(r.scope().find("12.5") != std::string::npos);
  CHECK_THROWS_AS(cpu_model_reader([] { return 0.0; }, cpu_model_config{0.0}), std::invalid_argument);
  CHECK_THROWS_AS(cpu_model_config{-1.0}.validate(), std::invalid_argument);
}

TEST_CASE("energy.meter.per_step_and_per_job") {
  double clock = 0.0;
  energy_meter m(std::make_unique<cpu_model_reader>([&] { return clock; }, cpu_model_config{10.0}));
  m.start(100.0);
  clock = 1.0;
  const auto& s1 = m.mark(101.0);
  CHECK(s1.joules == doctest::Approx(10.0));
  CHECK(s1.watts() == doctest::Approx(10.0));
  clock = 4.0;
  m.mark(103.0);
  CHECK(m.last_step().joules == doctest::Approx(30.0));
  CHECK(m.last_step().watts() == doctest::Approx(15.0));
  CHECK(m.job().joules == doctest::Approx(40.0));
  CHECK(m.job().seconds == doctest::Approx(3.0));
  CHECK(m.steps() == 2);
  CHECK(m.job().source == energy_source::estimated);
}

TEST_CASE("energy.sum.label_is_measured_only_if_all_parts_are") {
  std::vector<std::unique_ptr<energy_reader>> parts;
  parts.push_back(std::make_unique<cpu_model_reader>([] { return 0.0; }));
  parts.push_back(std::make_unique<cpu_model_reader>([] { return 0.0; }));
  sum_reader s(std::move(parts));
  CHECK(s.source() == energy_source::estimated);
  CHECK(s.name() == "cpu-model+cpu-model");
}

TEST_CASE("energy.rapl.sums_top_level_packages_with_wrap_around") {
  temp_dir t;
  zone(t.path, "intel-rapl:0", "package-0", 999'000'000, 1'000'000'000);
  zone(t.path, "intel-rapl:0:0", "core", 5, 1'000'000'000);  // inside package-0: never added
  zone(t.path, "intel-rapl:1", "package-1", 10'000'000, 1'000'000'000);
  rapl_reader r(t.path.string());
  CHECK(r.source() == energy_source::measured);
  CHECK(r.scope() == "RAPL package-0, package-1");
  CHECK(r.read_joules() == doctest::Approx(0.0));
  // package-0 wraps: 999 J -> 1000 J (range) -> 0 -> 3 J: +4 J; package-1 +2 J.
  write(t.path / "intel-rapl:0" / "energy_uj", "3000000");
  write(t.path / "intel-rapl:0:0" / "energy_uj", "900000000");
  write(t.path / "intel-rapl:1" / "energy_uj", "12000000");
  CHECK(r.read_joules() == doctest::Approx(6.0));
  CHECK(r.wraps() == 1);
  write(t.path / "intel-rapl:0" / "energy_uj", "4000000");
  CHECK(r.read_joules() == doctest::Approx(7.0));
}

TEST_CASE("energy.rapl.psys_alone_when_present") {
  temp_dir t;
  zone(t.path, "intel-rapl:0", "package-0", 0, 1000);
  zone(t.path, "intel-rapl:1", "psys", 0, 1000);
  rapl_reader r(t.path.string());
  CHECK(r.scope() == "RAPL psys");
}

TEST_CASE("energy.rapl.absent_tree_is_a_clear_error") {
  temp_dir t;
  CHECK_THROWS_WITH_AS(rapl_reader((t.path / "missing").string()), doctest::Contains("not a directory"), dra::error);
  CHECK_THROWS_WITH_AS(rapl_reader(t.path.string()), doctest::Contains("no intel-rapl:N zone"), dra::error);
  write(t.path / "intel-rapl:0" / "name", "package-0");
  write(t.path / "intel-rapl:0" / "energy_uj", "garbage");
  CHECK_THROWS_WITH_AS(rapl_reader(t.path.string()), doctest::Contains("not an unsigned integer"), dra::error);
}

TEST_CASE("energy.rapl.permission_denied_names_the_file_and_the_fix") {
  temp_dir t;
  zone(t.path, "intel-rapl:0", "package-0", 1, 1000);
  fs::permissions(t.path / "intel-rapl:0" / "energy_uj", fs::perms::owner_read);  // 0400, as since Linux 5.10
  fs::permissions(t.path, fs::perms::all);
  fs::permissions(t.path / "intel-rapl:0", fs::perms::all);
  if (geteuid() != 0) {
    CHECK_THROWS_WITH_AS(rapl_reader(t.path.string()), doctest::Contains("root only"), dra::error);
    return;
  }
  // root reads everything: check as an unprivileged user in a child process.
  const passwd* nobody = getpwnam("nobody");
  REQUIRE(nobody != nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) _exit(3);
    try {
      rapl_reader r(t.path.string());
      _exit(1);  // read what it must not
    } catch (const dra::error& e) {
      _exit(std::string(e.what()).find("root only") != std::string::npos ? 0 : 2);
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("energy.nvml.reads_the_fake_library") {
  void* lib = dlopen(DRA_FAKE_NVML, RTLD_NOW);
  REQUIRE(lib != nullptr);
  auto set = reinterpret_cast<void (*)(unsigned, int)>(dlsym(lib, "fake_nvml_set"));
  auto set_mj = reinterpret_cast<void (*)(unsigned, unsigned long long)>(dlsym(lib, "fake_nvml_set_energy_mj"));
  auto inits = reinterpret_cast<int (*)()>(dlsym(lib, "fake_nvml_inits"));
  set(2, 0);
  set_mj(0, 1'000'000);
  set_mj(1, 50'000);
  {
    nvml_reader r(DRA_FAKE_NVML);
    CHECK(r.source() == energy_source::measured);
    CHECK(r.scope() == "NVML GPU 0,1");
    CHECK(inits() == 1);
    set_mj(0, 1'002'500);
    set_mj(1, 51'000);
    CHECK(r.read_joules() == doctest::Approx(3.5));
    nvml_reader only_one(DRA_FAKE_NVML, {1});
    set_mj(1, 52'000);
    CHECK(only_one.read_joules() == doctest::Approx(1.0));
    CHECK_THROWS_AS(nvml_reader(DRA_FAKE_NVML, {5}), std::invalid_argument);
  }
  CHECK(inits() == 0);  // every reader shut NVML down again
  set(2, 3);
  CHECK_THROWS_WITH_AS(nvml_reader(DRA_FAKE_NVML), doctest::Contains("Not Supported"), dra::error);
  set(0, 0);
  CHECK_THROWS_WITH_AS(nvml_reader(DRA_FAKE_NVML), doctest::Contains("no GPU"), dra::error);
  set(2, 0);
  dlclose(lib);
}

TEST_CASE("energy.nvml.missing_library_is_a_clear_error") {
  CHECK_THROWS_WITH_AS(nvml_reader("libdra-no-such-nvml.so"), doctest::Contains("cannot load"), dra::error);
}

TEST_CASE("energy.detect.falls_back_and_says_why") {
  temp_dir t;
  detect_options o;
  o.nvml_library = "libdra-no-such-nvml.so";
  o.rapl_root = (t.path / "none").string();
  auto d = detect_energy_reader(o);
  CHECK(d.reader->name() == "cpu-model");
  CHECK(d.reader->source() == energy_source::estimated);
  REQUIRE(d.notes.size() == 2);
  CHECK(d.notes[0].find("nvml") == 0);
  CHECK(d.notes[1].find("rapl") == 0);
  zone(t.path / "none", "intel-rapl:0", "package-0", 1, 1000);
  auto r = detect_energy_reader(o);
  CHECK(r.reader->name() == "rapl");
  o.nvml_library = DRA_FAKE_NVML;
  auto n = detect_energy_reader(o);
  CHECK(n.reader->name() == "nvml");
}

TEST_CASE("energy.process_clock.advances_with_work") {
  const double a = process_cpu_seconds();
  volatile double x = 0;
  for (int i = 0; i < 20'000'000; ++i) x = x + 1e-9 * i;
  CHECK(process_cpu_seconds() > a);
}
