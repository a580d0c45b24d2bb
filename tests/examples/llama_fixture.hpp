#pragma once
// The Hugging Face Llama fixture (tests/data/hf_llama, written by
// tools/hf_reference/make_llama_fixture.py with transformers) and zshard's Llama run on it
// through the public API: read_hf_llama_config, load_hf, the engine, the example's model on
// host_llama_ops<float>.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../examples/gpt/ops_runner.hpp"
#include "../../examples/llama/llama_model.hpp"
#include "../../examples/llama/llama_ops.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/checkpoint/hf_checkpoint.hpp"
#include "zshard/checkpoint/safetensors_reader.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"

namespace llama_fixture {

namespace ck = zshard::checkpoint;

inline std::string dir() { return ZSHARD_HF_FIXTURE; }
inline std::string model_dir(bool tied) { return dir() + (tied ? "/tiny_tied" : "/tiny"); }

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}
inline void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(2); }

// A tensor of reference.safetensors as f32 (or int32 for the token ids), read whole.
class reference {
 public:
  reference() : f_(dir() + "/reference.safetensors") {}
  bool has(const std::string& name) const { return f_.find(name) != nullptr; }
  std::vector<float> floats(const std::string& name) const {
    const ck::tensor_entry& t = entry(name, ck::file_dtype::f32);
    std::vector<float> v(t.numel());
    f_.read(t, 0, t.numel(), v.data());
    return v;
  }
  std::vector<std::int32_t> ints(const std::string& name) const {
    const ck::tensor_entry& t = entry(name, ck::file_dtype::i32);
    std::vector<std::int32_t> v(t.numel());
    f_.read(t, 0, t.numel(), v.data());
    return v;
  }
  std::vector<std::int64_t> shape(const std::string& name) const { return entry(name, std::nullopt).shape; }

 private:
  const ck::tensor_entry& entry(const std::string& name, std::optional<ck::file_dtype> type) const {
    const ck::tensor_entry* t = f_.find(name);
    if (!t || (type && t->type != *type))
      throw std::runtime_error("reference.safetensors has no tensor '" + name + "' of the expected dtype");
    return *t;
  }
  ck::safetensors_file f_;
};

// Input ids and labels as transformers takes them ([rows, seq]), turned into zshard's batch:
// tokens = input_ids, targets[t] = labels[t + 1] (transformers shifts inside the model), the
// last position -100.
inline gpt::batch shifted_batch(const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& labels,
                                int rows) {
  const int seq = int(ids.size()) / rows;
  gpt::batch b{rows, seq, ids, std::vector<std::int32_t>(ids.size(), llama::ignore_index)};
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t + 1 < seq; ++t) b.targets[std::size_t(r * seq + t)] = labels[std::size_t(r * seq + t + 1)];
  return b;
}

// AdamW as the generator ran torch.optim.AdamW (reference.json): lr 1e-2, betas (0.9, 0.999),
// eps 1e-8, weight decay 0.1 on the weights and 0 on the norm gains, no clipping.
inline zshard::engine_config engine_config() {
  zshard::engine_config cfg;
  cfg.param_dtype = zshard::dtype::f32;
  cfg.adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
  cfg.clip_norm = 0.0;
  return cfg;
}

// What a run reports, all gathered to full tensors (by the model's parameter names).
struct run_result {
  std::vector<float> logits;        // step 1, [rows x seq, vocab] in the global batch's row order
  std::vector<double> step_losses;  // the global batch's mean loss before each step
  std::vector<std::vector<float>> grads, after;  // step 1's gradient, the weights after the last step
  std::vector<std::string> names;
};

struct run_options {
  bool tied = false;
  int world = 1;
  int micro = 1;  // micro-batches per rank
  bool checkpoint = true;
  int steps = 3;
  std::string weights;  // empty: the fixture's model_dir(tied)
};

// zshard's Llama on the fixture's batch: `world` thread ranks, each taking rows / world / micro
// rows per micro-batch (rank r's micro-batch m: rows [(m world + r) k, ... + k), as the main job),
// every micro-batch's loss divided by (label tokens of the whole batch) / (world x micro).
inline run_result run(const run_options& o) {
  const reference ref;
  const std::string p = o.tied ? "tied." : "";
  const auto ids = ref.ints(p + "input_ids");
  const int rows = int(ref.shape(p + "input_ids")[0]);
  const gpt::batch all = shifted_batch(ids, ref.ints(p + "labels"), rows);
  const int k = rows / (o.world * o.micro);
  if (k * o.world * o.micro != rows) throw std::invalid_argument("the fixture's rows do not split that way");
  std::size_t labels = 0;
  for (auto t : all.targets) labels += t != llama::ignore_index;

  const auto cfg = ck::read_hf_llama_config(model_dir(o.tied));
  const llama::zshard_model model = llama::make_zshard_model(cfg, 7);
  run_result out;
  const std::size_t vocab = std::size_t(cfg.vocab_size), seq = std::size_t(all.seq_len);
  out.logits.resize(std::size_t(rows) * seq * vocab);
  using engine_t = zshard::engine<zshard::host_backend, zshard::thread_comm>;
  zshard::run_ranks(o.world, [&](zshard::thread_comm& comm) {
    zshard::host_backend backend;
    engine_t eng(backend, comm, model.spec, engine_config());
    ck::load_hf(eng, o.weights.empty() ? model_dir(o.tied) : o.weights);
    llama::host_llama_ops<float> ops;
    llama::ops_llama<llama::host_llama_ops<float>> net(ops, cfg, k, all.seq_len, o.checkpoint);
    net.set_loss_tokens(double(labels) / double(o.world * o.micro));
    gpt::ops_engine_runner<engine_t, llama::host_llama_ops<float>, decltype(net), llama::zshard_model> runner(
        eng, model, &net, net.arena_bytes(), o.checkpoint);
    for (int step = 1; step <= o.steps; ++step) {
      float loss = 0;
      for (int m = 0; m < o.micro; ++m) {
        const int first = (m * o.world + comm.rank()) * k;
        runner.train_micro_batch(all.slice(first, k));
        loss += float(runner.mean_loss());
        if (step == 1) {
          const auto l = net.logits();
          std::copy(l.begin(), l.end(), out.logits.begin() + std::ptrdiff_t(std::size_t(first) * seq * vocab));
        }
      }
      loss /= float(o.micro);
      comm.all_reduce(&loss, &loss, 1, zshard::dtype::f32, zshard::reduce_op::average);
      if (comm.rank() == 0) out.step_losses.push_back(loss);
      if (step == 1)
        for (zshard::param_id q = 0; q < model.spec.params().size(); ++q) {
          auto g = eng.gather_grad(q);
          if (comm.rank() == 0) out.grads.push_back(std::move(g));
        }
      eng.step();
    }
    for (zshard::param_id q = 0; q < model.spec.params().size(); ++q) {
      auto w = eng.gather_param(q);
      if (comm.rank() == 0) {
        out.after.push_back(std::move(w));
        out.names.push_back(model.spec.params()[q].name);
      }
    }
  });
  return out;
}

// max |got - want| over the tensor, and the tensor's largest |want| (its scale).
struct error_of {
  double max_abs = 0, scale = 0;
  double relative() const { return scale > 0 ? max_abs / scale : max_abs; }
};
inline error_of compare(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) throw std::runtime_error("compare: sizes differ");
  error_of e;
  for (std::size_t i = 0; i < got.size(); ++i) {
    e.max_abs = std::max(e.max_abs, std::abs(double(got[i]) - double(want[i])));
    e.scale = std::max(e.scale, std::abs(double(want[i])));
  }
  return e;
}

}  // namespace llama_fixture
