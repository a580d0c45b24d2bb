// The README's usage example, compiled and run through the umbrella header, so the docs
// cannot drift from the API. The code below is compiled with -Wmissing-field-initializers as an
// error (the project's own flags turn that warning off, and a user's -Wall -Wextra turns it on):
// the README's designated initializers leave members out, and must not warn. A pragma rather
// than a flag for this file, so the file stays in its program's unity build.
#include <doctest/doctest.h>

#include <cmath>

#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/checkpoint/hf_checkpoint.hpp"
#include "zshard/checkpoint/hf_export.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/testing/invariants.hpp"
#include "zshard/zshard.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wmissing-field-initializers"

namespace readme_snippets {
// The README's other snippets with designated initializers, compiled (never run: they name files).
[[maybe_unused]] void compile_only(zshard::engine<zshard::host_backend, zshard::thread_comm>& eng,
                                   const std::string& data_position, const zshard::plan::training_schedule& schedule) {
  zshard::engine_config cfg;
  cfg.adamw = {.lr = 3e-4f, .weight_decay = 0.1f};  // group "default"
  cfg.param_groups = {
      {.name = "embeddings", .params = {"tok_embed"}, .lr = 1e-3f, .weight_decay = 0.0f},
      {.name = "head", .match = [](const zshard::param_spec& p) { return p.name.starts_with("head."); }, .lr = 1e-4f},
  };
  cfg.clip_norm = 1.0;
  cfg.clip_norm_type = INFINITY;
  [[maybe_unused]] const auto options = zshard::plan::plan_options{.keep_gathered_until_backward = {"block0.attn"}, .no_sync = true};
  [[maybe_unused]] const auto plan = zshard::plan::plan_memory(eng.spec(), cfg, 8, schedule,
                                                               {.overheads = zshard::plan::device_overheads::cuda_defaults()});
  namespace ck = zshard::checkpoint;
  ck::load_pretrained(eng, "model.safetensors.index.json",
                      {.name_map = [](const std::string& n) { return "model." + n; }});
  ck::save(eng, "ckpt", {.keep_last = 3, .user_state = data_position});
  [[maybe_unused]] auto info = ck::load(eng, "ckpt");
  ck::export_engine(eng, "model.safetensors", {.type = zshard::dtype::bf16});
  ck::hf_llama_config hf = ck::read_hf_llama_config("Llama-3.1-8B");  // "Fine-tune a Hugging Face Llama"
  ck::load_hf(eng, "Llama-3.1-8B");
  ck::export_hf(eng, "out", {.type = zshard::dtype::bf16, .config = hf.to_json(zshard::dtype::bf16)});
}
}  // namespace readme_snippets

TEST_CASE("the README example trains and leaves a clean step boundary") {
  zshard::model_spec spec;
  auto w = spec.add_param("block0.w", {64, 64});
  auto b = spec.add_param("block0.b", {64}, {.decay = false, .init = zshard::init::constant(0.0f)});
  auto block0 = spec.add_module("block0", {w, b});

  zshard::run_ranks(4, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, {});
    for (int step = 0; step < 10; ++step) {
      { auto g = eng.forward(block0); CHECK(g.param_data<float>(1)[0] == 0.0f); }
      eng.begin_backward();
      {
        auto g = eng.backward(block0);
        g.grad_data(0)[0] += 1.0f;
      }
      eng.end_backward();
      const auto r = eng.step();
      CHECK(r.grad_norm == doctest::Approx(1.0));
      ZSHARD_CHECK_STEP_INVARIANTS(eng);
      ZSHARD_CHECK_MEMORY_BOUNDS(eng);
    }
    // AdamW moved w[0] against its gradient, by about lr per step
    const auto w0 = eng.gather_param(w);
    const auto init = spec.param(w).init(0);
    CHECK(w0[0] < init - 5e-3f);
  });
}

// The README's policy example: a Partitioner family written from scratch, swapped in by type.
namespace readme_policy {

struct replicate_all {
  using zshard_tag = zshard::partitioner_tag;  // opt in: a look-alike never counts
  template <class Backend, class Comm>
  using impl = replicate_all;
  // p: the parameter's identity (id, name, shape, dtype), to place parameters by name or kind
  zshard::shard_layout layout(const zshard::param_identity& p, int /*world*/, const zshard::partition_config&) const {
    return {.numel = p.numel(), .shard_numel = p.numel(), .padded_numel = p.numel(), .replicated = true};
  }
};
static_assert(zshard::check_partitioner<replicate_all>());  // readable errors at the definition

struct my_policies : zshard::default_policies {
  using partitioner = replicate_all;
};

}  // namespace readme_policy

TEST_CASE("the README policy example: replicate_all keeps every parameter whole and trains like the default") {
  zshard::model_spec spec;
  auto w = spec.add_param("block0.w", {16, 16});
  auto block0 = spec.add_module("block0", {w});
  std::vector<float> by_policy[2];
  for (int variant = 0; variant < 2; ++variant) {
    zshard::run_ranks(2, [&](zshard::thread_comm& comm) {
      zshard::host_backend backend;
      const auto train = [&](auto& eng) {
        for (int step = 0; step < 3; ++step) {
          { auto g = eng.forward(block0); }
          eng.begin_backward();
          {
            auto g = eng.backward(block0);
            for (int i = 0; i < 256; ++i) g.grad_data(0)[i] += float(i % 7) - 3.0f;
          }
          eng.end_backward();
          eng.step();
        }
        const auto full = eng.gather_param(w);
        if (comm.rank() == 0) by_policy[variant] = full;
      };
      if (variant == 0) {
        zshard::engine<zshard::host_backend, zshard::thread_comm, readme_policy::my_policies> eng(backend, comm, spec,
                                                                                                 {});
        CHECK(eng.layout(w).replicated);
        CHECK(backend.ledger().peak(zshard::mem_category::gathered_params) == 0);  // never gathers
        train(eng);
        CHECK(backend.ledger().peak(zshard::mem_category::gathered_params) == 0);
      } else {
        zshard::engine<zshard::host_backend, zshard::thread_comm> eng(backend, comm, spec, {});
        CHECK_FALSE(eng.layout(w).replicated);
        train(eng);
      }
    });
  }
  REQUIRE(by_policy[0].size() == 256);
  for (std::size_t i = 0; i < 256; ++i) CHECK(by_policy[0][i] == doctest::Approx(by_policy[1][i]).epsilon(1e-6));
}

#pragma GCC diagnostic pop
