// Issue 26, in the build users make: this program is compiled with -march=native (where the
// compiler takes it: ZSHARD_NATIVE, as the examples and benches), so the compiler may contract
// any scalar multiply-add into an FMA, which rounds once where the AdamW kernels' vector code
// rounds twice. Here too an element must get the same bits in a full vector and in a tail, and
// training must be bitwise the same for every world size. (The rest of the suite is built for
// baseline x86-64; these two cases run there as well.)
#include "../offload/adamw_positions.hpp"
#include "../safety/world_bitwise.hpp"
