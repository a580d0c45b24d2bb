#pragma once
// A policy whose implementation is a class template of the backend and communicator, declared
// in one line: `using my_reducer = test_support::family<zshard::reducer_tag, my_reducer_impl>;`.
// With an Impl in an unnamed namespace, derive a type of its own there instead
// (`struct my_reducer : family<...> {};`): GCC does not count a template template argument in a
// type's linkage, and -Wsubobject-linkage would fire on the engine that holds the Impl.

namespace test_support {

template <class Tag, template <class, class> class Impl>
struct family {
  using zshard_tag = Tag;
  template <class Backend, class Comm>
  using impl = Impl<Backend, Comm>;
};

}  // namespace test_support
