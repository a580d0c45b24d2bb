// 06_train_llama: the main job with a Hugging Face Llama. Loads a checkpoint directory as
// transformers writes it (config.json, model.safetensors.index.json and its shards) into zshard
// (ZeRO-3: every rank holds 1/N of every parameter, gradient and AdamW state), fine-tunes it on
// the main job's data as a supervised fine-tune (each sequence's first --prompt-tokens positions
// are the prompt: labels -100, no loss), and writes it back as a Hugging Face directory that
// transformers loads unchanged. Thread ranks (default) or MPI processes (--mpi), host backend;
// the model is examples/llama (the ops interface a GPU implements too). Run with --help.
//   scripts/run_example.sh --model llama --init-from tests/data/hf_llama/tiny --steps 20 --export out/
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "gpt/corpus.hpp"
#include "gpt/ops_runner.hpp"
#include "llama/llama_model.hpp"
#include "llama/llama_ops.hpp"
#include "llama/llama_options.hpp"
#include "zshard/backend/host_backend.hpp"
#include "zshard/checkpoint/checkpoint.hpp"
#include "zshard/checkpoint/hf_checkpoint.hpp"
#include "zshard/checkpoint/hf_export.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/prefetch/pass_trace_prefetcher.hpp"
#ifdef ZSHARD_EXAMPLE_MPI
#include "zshard/comm/mpi_run.hpp"
#endif

namespace {

using options = llama::train_options;
using ops_t = llama::host_llama_ops<float>;
namespace ck = zshard::checkpoint;

// The job's data: sequences of the corpus, targets the next tokens, the prompt's labels -100.
gpt::batch sft_rows(const gpt::corpus& data, std::uint64_t index, int first, int count, const options& o) {
  gpt::batch b = data.get_rows(index, first, count, o.seq);
  for (int r = 0; r < count; ++r)
    for (int t = 0; t < o.prompt(); ++t) b.targets[std::size_t(r) * std::size_t(o.seq) + std::size_t(t)] = llama::ignore_index;
  return b;
}

// One prefetch trace per kind of pass: the evaluations replay their own.
struct example_policies : zshard::default_policies {
  using prefetcher = zshard::prefetch::pass_trace;
};

struct run_result {
  int first_step = 1;
  double first_loss = 0, last_loss = 0;
  std::size_t peak_bytes = 0;  // the largest rank's ledger peak
};

template <class Comm>
void train_rank(Comm& comm, const options& o, const gpt::corpus& data, const llama::zshard_model& model,
                const zshard::engine_config& cfg, run_result& out) {
  const int rank = comm.rank(), world = comm.size();
  zshard::host_backend backend(std::nullopt, "rank " + std::to_string(rank));
  using engine_t = zshard::engine<zshard::host_backend, Comm, example_policies>;
  engine_t eng(backend, comm, model.spec, cfg);
  ops_t ops;
  llama::ops_llama<ops_t> net(ops, model.cfg, o.batch, o.seq, o.checkpoint);
  // every micro-batch's loss over the global batch's label tokens / (ranks x micro-batches): the
  // gradient the engine averages is then the global batch's mean's (llama_model.hpp)
  const double labels = double(o.seq - o.prompt()) * double(o.batch) * world * o.micro_batches;
  net.set_loss_tokens(labels / double(world * o.micro_batches));
  gpt::ops_engine_runner<engine_t, ops_t, llama::ops_llama<ops_t>, llama::zshard_model> runner(
      eng, model, &net, net.arena_bytes(), o.checkpoint);

  int start = 0;
  if (!o.resume.empty()) {
    const auto info = ck::load(eng, o.resume);
    start = int(info.step);
    if (rank == 0) std::printf("resumed from %s at step %d\n", info.path.c_str(), start);
  } else if (!o.init_from.empty()) {
    const auto rep = ck::load_hf(eng, o.init_from);
    if (rank == 0) std::printf("loaded %zu tensors from the Hugging Face checkpoint %s\n", rep.loaded, o.init_from.c_str());
  }
  if (start >= o.steps)
    throw std::invalid_argument("nothing to train: the checkpoint is at step " + std::to_string(start) +
                                ", --steps is " + std::to_string(o.steps));
  if (rank == 0) out.first_step = start + 1;
  auto clock = std::chrono::steady_clock::now();
  for (int step = start + 1; step <= o.steps; ++step) {
    backend.ledger().reset_peaks();
    float loss = 0;
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      runner.train_micro_batch(sft_rows(data, std::uint64_t(step - 1), gpt::first_row(mb, rank, world, o.batch), o.batch, o));
      loss += float(runner.mean_loss());
    }
    const zshard::step_report rep = eng.step();
    loss /= float(o.micro_batches);
    comm.all_reduce(&loss, &loss, 1, zshard::dtype::f32, zshard::reduce_op::average);
    float peak = float(backend.ledger().total_peak());  // bytes; exact below 2^24 MiB
    comm.all_reduce(&peak, &peak, 1, zshard::dtype::f32, zshard::reduce_op::max);
    if (rank == 0) {
      if (step == start + 1) out.first_loss = loss;
      out.last_loss = loss;
      out.peak_bytes = std::max(out.peak_bytes, std::size_t(peak));
      if (step % o.log_every == 0 || step == start + 1 || step == o.steps) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock).count();
        std::printf("step %4d  loss %.4f  grad-norm %.3f%s  %.1f s  peak/rank %.2f MiB\n", step, loss, rep.grad_norm,
                    rep.skipped ? " (skipped)" : "", secs, double(peak) / (1 << 20));
        std::fflush(stdout);
      }
    }
    if (o.eval_every > 0 && step % o.eval_every == 0) {
      runner.evaluate(sft_rows(data, 1'000'000 + std::uint64_t(step), rank * o.batch, o.batch, o));
      float eval = float(runner.mean_loss());
      comm.all_reduce(&eval, &eval, 1, zshard::dtype::f32, zshard::reduce_op::average);
      if (rank == 0) std::printf("  eval (no-grad pass) loss %.4f\n", eval);
    }
    if (!o.save_dir.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == o.steps)) {
      const auto s = ck::save(eng, o.save_dir, {.user_state = "06_train_llama step " + std::to_string(step)});
      if (rank == 0) std::printf("  saved %s\n", s.path.c_str());
    }
  }
  if (!o.export_dir.empty()) {
    ck::hf_export_options x;
    x.type = llama::export_dtype(o, model.cfg.dtype_name);
    x.max_shard_bytes = o.max_shard_bytes;
    x.config = model.cfg.to_json(x.type);
    ck::export_hf(eng, o.export_dir, x);
    if (rank == 0)
      std::printf("exported %s (%s): load it with transformers' AutoModelForCausalLM.from_pretrained\n",
                  o.export_dir.c_str(), std::string(zshard::to_string(x.type)).c_str());
  }
  if (!o.logits_out.empty()) {
    // With --export, on the weights as exported (read back from the directory, so rounded to
    // its dtype as transformers will read them). Every rank runs the pass (collective scopes);
    // rank 0 writes its rows.
    if (!o.export_dir.empty()) ck::load_hf(eng, o.export_dir);
    const gpt::batch b = sft_rows(data, 2'000'000, rank * o.batch, o.batch, o);
    runner.evaluate(b);
    const std::vector<float> logits = net.logits();
    if (rank == 0) {
      ck::safetensors_writer w(o.logits_out,
                               {{"input_ids", ck::file_dtype::i32, {o.batch, o.seq}},
                                {"logits", ck::file_dtype::f32, {o.batch, o.seq, model.cfg.vocab_size}}},
                               {{"format", "pt"}});
      w.write(b.tokens.data(), b.tokens.size() * sizeof(std::int32_t));
      w.write(logits.data(), logits.size() * sizeof(float));
      w.finish();
      std::printf("logits of a held-out batch written to %s\n", o.logits_out.c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = llama::parse_options(argc, argv);
  if (o.help) {
    llama::print_usage();
    return 0;
  }
  const auto cfg = ck::read_hf_llama_config(o.init_from.empty() ? o.config : o.init_from);
  const gpt::corpus data = o.text.empty() ? gpt::corpus::synthetic(o.seed, std::min(64, cfg.vocab_size))
                                          : gpt::corpus::from_file(o.text, o.seq, o.seed);
  if (data.vocab() > cfg.vocab_size)
    throw std::invalid_argument("the data's " + std::to_string(data.vocab()) + " tokens do not fit the model's vocab_size " +
                                std::to_string(cfg.vocab_size));
  const llama::zshard_model model = llama::make_zshard_model(cfg, o.seed);
  zshard::engine_config ecfg;
  ecfg.param_dtype = zshard::dtype::f32;
  ecfg.adamw.lr = o.lr;
  ecfg.adamw.weight_decay = o.weight_decay;
  ecfg.clip_norm = o.clip;
  const auto header = [&](int world, const char* kind) {
    std::printf("zshard Llama example: %d %s, %zu parameters in %zu modules (%d layers, hidden %d, %d query and %d "
                "key/value heads, intermediate %d, vocab %d%s)\n",
                world, kind, model.spec.total_numel(), model.spec.modules().size(), cfg.num_hidden_layers,
                cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
                cfg.vocab_size, cfg.tie_word_embeddings ? ", tied embeddings" : "");
    std::printf("  %s data, seq %d of which %d prompt tokens (labels -100); batch %d x %d micro-batch(es) per rank; lr "
                "%g, clip %g; %s\n",
                o.text.empty() ? "synthetic" : o.text.c_str(), o.seq, o.prompt(), o.batch, o.micro_batches,
                double(o.lr), o.clip, o.checkpoint ? "activation checkpointing" : "no checkpointing");
    std::fflush(stdout);
  };
  run_result res;
  int rank = 0;
  if (o.mpi) {
#ifdef ZSHARD_EXAMPLE_MPI
    zshard::run_mpi(argc, argv, [&](zshard::mpi_comm& comm) {
      rank = comm.rank();
      if (rank == 0) header(comm.size(), "MPI processes");
      train_rank(comm, o, data, model, ecfg, res);
    });
#else
    throw std::invalid_argument("--mpi: this build has no MPI (install libopenmpi-dev and openmpi-bin, reconfigure)");
#endif
  } else {
    header(o.ranks, "thread ranks");
    zshard::run_ranks(o.ranks, [&](zshard::thread_comm& comm) { train_rank(comm, o, data, model, ecfg, res); });
  }
  if (rank != 0) return 0;
  std::printf("\nloss %.4f -> %.4f over %d step(s); peak per rank %.2f MiB\n", res.first_loss, res.last_loss,
              o.steps - res.first_step + 1, double(res.peak_bytes) / (1 << 20));
  std::printf("final_loss: %.9g\n", res.last_loss);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "06_train_llama: %s\n", e.what());
  return 2;
}
