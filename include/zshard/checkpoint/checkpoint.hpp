#pragma once
// zshard's checkpoint API in one include (needs nlohmann-json):
//   checkpoint::load_pretrained(eng, "model.safetensors" | "model.safetensors.index.json", opts)
//   checkpoint::save(eng, dir, opts) / checkpoint::load(eng, dir, opts)     sharded, any world size
//   checkpoint::export_engine(eng, file, opts) / export_checkpoint(dir, file, opts)
// All engine calls are collective: every rank calls them, between steps.
#include "zshard/checkpoint/export.hpp"
#include "zshard/checkpoint/pretrained.hpp"
#include "zshard/checkpoint/sharded_load.hpp"
#include "zshard/checkpoint/sharded_save.hpp"
