#pragma once
// The ways tests split a communicator (split(color, key), MPI_Comm_split's semantics), shared
// by the thread and MPI communicators' tests, and the members of a rank's group: every rank of
// the same color, ordered by key, then by parent rank.
#include <algorithm>
#include <utility>
#include <vector>

namespace test_support {

struct split_rule {
  const char* name;
  int (*color)(int rank, int world);
  int (*key)(int rank, int world);
};

inline constexpr split_rule split_rules[] = {
    {"parity, reversed order", [](int q, int) { return q % 2; }, [](int q, int) { return -q; }},
    {"blocks of 3", [](int q, int) { return q / 3; }, [](int q, int) { return q; }},
    {"last rank alone, keys tied", [](int q, int n) { return q == n - 1 ? 7 : 0; }, [](int, int) { return 0; }},
    {"everyone, same key", [](int, int) { return 3; }, [](int, int) { return 0; }},
};

// (key, parent rank) of every member of `rank`'s group, in the group's rank order.
inline std::vector<std::pair<int, int>> split_members(const split_rule& rule, int rank, int world) {
  std::vector<std::pair<int, int>> members;
  for (int q = 0; q < world; ++q)
    if (rule.color(q, world) == rule.color(rank, world)) members.emplace_back(rule.key(q, world), q);
  std::sort(members.begin(), members.end());
  return members;
}

}  // namespace test_support
