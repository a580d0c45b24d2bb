#pragma once
// How long a thread rank that arrived early at a rendezvous busy-waits before it sleeps on the
// condition variable: learned per rank from the waits it has seen.
//
// Why learn it. Sleeping costs the futex wake-up when the peer arrives (20-50 us on a VM),
// which dominates small collectives: on a quiet 2-core machine a 1 KiB all-reduce of 2 ranks
// took 67 us with a fixed spin of 16 pauses, most of it two wake-ups. Spinning is only right
// while the peer is running and close: when other processes load the machine, the spinning
// rank holds a core the late rank may be waiting for. So the budget follows the waits: a wait
// that slept but ended within the ceiling raises the budget to twice that wait (the next
// similar one is caught spinning); a wait longer than the ceiling halves it, down to about the
// old fixed spin, which a machine under load keeps it at.
//
// Never spin against a peer on the same core. With more runnable threads than cores (other
// processes, even niced ones) the scheduler may queue the late rank on the spinner's core,
// where every microsecond of spinning delays the very arrival it waits for: measured on 2
// cores beside two niced compilers, a 2-rank 1 KiB all-reduce went from 6 us to 300 us. So
// each rank records the CPU it computes on (running_cpus), and a spinner gives up as soon as
// a rank that has not arrived was last seen on its own CPU.
//
// Never spin on a busy machine. Even when peers run elsewhere, the idle time a sleeping rank
// leaves is where other processes run; a spinning rank takes it, so they preempt computing
// ranks instead and every collective waits for the preempted one (2 ranks beside two niced
// compilers: 20% fewer tokens/s than sleeping). A rank's own involuntary context switches
// (getrusage, read every check_every waits) show that others want its core: then it spins
// only the floor until a check finds none.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#endif

namespace zshard::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// The CPU the calling thread runs on, or -1 where the platform does not say.
inline int current_cpu() noexcept {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

// Where each rank last ran while computing (between two rendezvous); -1 while it waits in one.
// Written by the rank's own thread, read by spinning peers: a hint, so relaxed atomics.
class running_cpus {
 public:
  explicit running_cpus(std::size_t ranks) : cpu_(ranks) {
    for (auto& c : cpu_) c.store(-1, std::memory_order_relaxed);
  }
  void waiting(std::size_t rank) noexcept { cpu_[rank].store(-1, std::memory_order_relaxed); }
  void computing(std::size_t rank) noexcept { cpu_[rank].store(current_cpu(), std::memory_order_relaxed); }
  // Whether a rank other than `rank` was last seen computing on `cpu` (>= 0).
  bool peer_computing_on(std::size_t rank, int cpu) const noexcept {
    if (cpu < 0) return false;
    for (std::size_t q = 0; q < cpu_.size(); ++q)
      if (q != rank && cpu_[q].load(std::memory_order_relaxed) == cpu) return true;
    return false;
  }

 private:
  std::vector<std::atomic<int>> cpu_;  // sized once: atomics do not move
};

// How many times the calling thread was preempted so far (0 where the platform does not say).
inline long involuntary_switches() noexcept {
#if defined(__linux__) && defined(RUSAGE_THREAD)
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) == 0) return u.ru_nivcsw;
#endif
  return 0;
}

class adaptive_spin {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::int64_t floor_ns = 1'000;      // about the old fixed 16 pauses
  static constexpr std::int64_t ceiling_ns = 200'000;  // a step's compute imbalance between lock-step ranks

  // Busy-waits from `start` until done() is true, the budget has passed, or give_up() (checked
  // with the clock, about every microsecond); returns done().
  template <class Done, class GiveUp>
  bool spin(Done&& done, GiveUp&& give_up, clock::time_point start) const noexcept {
    for (;;) {
      for (int i = 0; i < pauses_per_clock_read; ++i) {
        if (done()) return true;
        cpu_relax();
      }
      if (give_up() || clock::now() - start >= std::chrono::nanoseconds(budget_ns_)) return done();
    }
  }

  // Called before each spin: every check_every waits, looks whether the thread was preempted
  // since the last look; if so the budget drops to the floor and stays there until it was not.
  void check_contention() noexcept {
    if (++waits_since_check_ < check_every) return;
    waits_since_check_ = 0;
    const long now = involuntary_switches();
    contended_ = now - switches_at_check_ > tolerated_switches;
    switches_at_check_ = now;
    if (contended_) budget_ns_ = floor_ns;
  }

  // The whole wait, spin and sleep, took `waited`; `caught` if the spin saw it end (then the
  // budget was enough and stays).
  void learn(clock::duration waited, bool caught) noexcept {
    if (caught || contended_) return;
    const std::int64_t w = std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count();
    if (w < ceiling_ns) budget_ns_ = std::clamp(2 * w, budget_ns_, ceiling_ns);
    else budget_ns_ = std::max(floor_ns, budget_ns_ / 2);
  }

  std::int64_t budget_ns() const noexcept { return budget_ns_; }

 private:
  static constexpr int pauses_per_clock_read = 32;
  static constexpr int check_every = 32;  // a getrusage call per 32 waits: well under 1% of a wait
  static constexpr long tolerated_switches = 1;  // a kernel thread now and then is not a busy machine
  std::int64_t budget_ns_ = floor_ns;
  int waits_since_check_ = 0;
  long switches_at_check_ = involuntary_switches();  // of the thread that made the world; the first check resets it
  bool contended_ = false;
};

}  // namespace zshard::detail
