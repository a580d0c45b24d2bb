#pragma once
// The GPT example's model as zshard sees it: one zshard module per GPT module with parameters,
// registered from describe() with initial values from init_value. No Eigen: the backend-generic
// model (ops_model.hpp, for the GPU too) and the Eigen one (zshard_gpt.hpp) share it.
#include <cstdint>
#include <string>
#include <vector>

#include "gpt_config.hpp"
#include "zshard/model/model_spec.hpp"

namespace gpt {

struct zshard_model {
  gpt_config config;
  std::vector<module_desc> desc;  // describe(config): embed, blocks, head, loss
  zshard::model_spec spec;
  zshard::module_id embed = 0, head = 0;
  std::vector<zshard::module_id> blocks;
};

// One zshard module per GPT module with parameters (the loss has none and needs no scope).
// Initial values come from init_value, a function of the element index, so the model is the
// same for every world size.
inline zshard_model make_zshard_model(const gpt_config& c, std::uint64_t seed) {
  c.validate();
  zshard_model m{c, describe(c), {}, 0, 0, {}};
  for (const auto& mod : m.desc) {
    if (mod.params.empty()) continue;
    std::vector<zshard::param_id> ids;
    for (const auto& p : mod.params) {
      zshard::shape s;
      if (p.shape.size() == 1) s = {p.shape[0]};
      else s = {p.shape[0], p.shape[1]};
      const std::uint64_t name_hash = hash_string(p.name);
      ids.push_back(m.spec.add_param(p.name, s,
                                     {.decay = p.decay,
                                      .init = [p, name_hash, seed](std::int64_t i) {
                                        return init_value(p, name_hash, i, seed);
                                      },
                                      .file_transposed = p.linear}));
    }
    const auto id = m.spec.add_module(mod.name, ids);
    if (mod.name == "embed") m.embed = id;
    else if (mod.name == "head") m.head = id;
    else m.blocks.push_back(id);
  }
  return m;
}

}  // namespace gpt
