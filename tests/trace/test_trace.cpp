// The opt-in trace: a sharded run with engine_config::trace writes Chrome/Perfetto JSON that
// parses, has every kind of engine event on every rank, and whose ledger counter peaks (total
// and per category) equal each rank's ledger peaks; training with the trace on equals training
// with it off, bit for bit; pausing records nothing and resumes with a fresh ledger sample.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "../engine/toy_training.hpp"
#include "zshard/trace/trace_sink.hpp"

using namespace zshard;

namespace {

struct rank_peaks {
  std::size_t total = 0;
  std::array<std::size_t, mem_category_count> by_category{};
};

struct traced_run {
  std::vector<std::vector<float>> params;  // rank 0's gathered parameters after training
  std::map<int, rank_peaks> peaks;         // each rank's ledger peaks over the whole run
};

// toy::train_rank's loop, with activations reported (different per rank) so every category moves.
traced_run run(int world, trace_sink* sink, int steps, int pause_before_step = -1) {
  traced_run out;
  std::mutex mu;
  toy::train_options o;
  o.world = world;
  o.engine.trace = sink;
  o.engine.reduce.reduce_bucket_numel = 64;  // several flushes per backward
  run_ranks(world, [&](thread_comm& comm) {
    toy::ids id;
    host_backend backend;
    {
      engine<host_backend, thread_comm> eng(backend, comm, toy::make_spec(o.model, id), o.engine);
      const int rank = comm.rank();
      for (int step = 0; step < steps; ++step) {
        if (sink && step == pause_before_step) {
          comm.barrier();
          if (rank == 0) sink->set_recording(false);
          comm.barrier();
        }
        const toy::batch global = toy::make_batch(o.model.vocab, std::uint64_t(step), world * o.rows);
        eng.report_activations(std::size_t(1000 * (rank + 1) + 8 * step));
        toy::run_micro_batch(eng, o.model, id, toy::slice(global, rank * o.rows, o.rows), false);
        eng.report_activations(0);
        eng.step();
        if (sink && step == pause_before_step) {
          comm.barrier();
          if (rank == 0) sink->set_recording(true);
          comm.barrier();
        }
      }
      std::vector<std::vector<float>> params;
      for (param_id p = 0; p < eng.spec().params().size(); ++p) params.push_back(eng.gather_param(p));
      if (rank == 0) out.params = std::move(params);
    }
    rank_peaks pk;
    pk.total = backend.ledger().total_peak();
    for (std::size_t c = 0; c < mem_category_count; ++c) pk.by_category[c] = backend.ledger().peak(mem_category(c));
    std::lock_guard lock(mu);
    out.peaks[comm.rank()] = pk;
  });
  return out;
}

nlohmann::json parsed(const trace_sink& sink) {
  std::ostringstream os;
  sink.write(os);
  return nlohmann::json::parse(os.str());  // throws if it is not JSON
}

}  // namespace

TEST_CASE("the trace parses, covers every rank and event kind, and its counter peaks are the ledger's") {
  constexpr int world = 3;
  trace_sink sink;
  const traced_run r = run(world, &sink, 3);
  const nlohmann::json j = parsed(sink);
  REQUIRE(j.contains("traceEvents"));
  const auto& events = j["traceEvents"];

  std::map<int, std::set<std::string>> categories;  // per rank
  std::map<int, rank_peaks> counter_peaks;
  std::map<int, std::string> process_names;
  for (const auto& e : events) {
    const int pid = e.at("pid").get<int>();
    const std::string ph = e.at("ph").get<std::string>();
    if (ph == "M") {
      if (e.at("name") == "process_name") process_names[pid] = e.at("args").at("name").get<std::string>();
      continue;
    }
    categories[pid].insert(e.at("cat").get<std::string>());
    if (ph == "X") CHECK(e.at("dur").get<double>() >= 0.0);
    if (ph == "C") {
      std::size_t total = 0;
      auto& pk = counter_peaks[pid];
      for (std::size_t c = 0; c < mem_category_count; ++c) {
        const auto v = e.at("args").at(std::string(to_string(mem_category(c)))).get<std::size_t>();
        total += v;
        pk.by_category[c] = std::max(pk.by_category[c], v);
      }
      pk.total = std::max(pk.total, total);
    }
  }
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(process_names[rank] == "rank " + std::to_string(rank));
    for (const char* cat : {"scope", "gather", "release", "reduce", "optimizer", "wait", "memory"})
      CHECK_MESSAGE(categories[rank].count(cat) == 1, "no '" << cat << "' event");
    const rank_peaks& ledger = r.peaks.at(rank);
    CHECK(counter_peaks[rank].total == ledger.total);
    CHECK(ledger.total > 0);
    for (std::size_t c = 0; c < mem_category_count; ++c) {
      CAPTURE(to_string(mem_category(c)));
      CHECK(counter_peaks[rank].by_category[c] == ledger.by_category[c]);
    }
  }
  // activations were reported differently per rank, and the trace tells them apart
  CHECK(counter_peaks[0].by_category[std::size_t(mem_category::activations)] <
        counter_peaks[2].by_category[std::size_t(mem_category::activations)]);
}

TEST_CASE("training with the trace on equals training with it off") {
  trace_sink sink;
  const auto on = run(2, &sink, 3), off = run(2, nullptr, 3);
  REQUIRE(on.params.size() == off.params.size());
  for (std::size_t p = 0; p < on.params.size(); ++p) CHECK(on.params[p] == off.params[p]);
}

TEST_CASE("a paused trace records nothing, and resumes with a fresh ledger sample") {
  trace_sink sink;
  run(2, &sink, 3, /*pause_before_step=*/1);
  const nlohmann::json j = parsed(sink);
  // steps 0 and 2 are recorded, step 1 is not: two AdamW spans per rank (the optimizer category
  // also holds each step's gradient statistics)
  std::map<int, int> optimizer_spans;
  for (const auto& e : j["traceEvents"])
    if (e.at("ph") == "X" && e.at("cat") == "optimizer" && e.at("name").get<std::string>().starts_with("optimizer ("))
      ++optimizer_spans[e.at("pid").get<int>()];
  CHECK(optimizer_spans[0] == 2);
  CHECK(optimizer_spans[1] == 2);
}

TEST_CASE("write_file names a path it cannot write") {
  trace_sink sink;
  try {
    sink.write_file("/nonexistent-dir/trace.json");
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.kind() == error_kind::io);
    CHECK(std::string(e.what()).find("/nonexistent-dir/trace.json") != std::string::npos);
  }
}
