// hopwise's errors as torch's (bad arguments a ValueError, the rest a RuntimeError, each with hopwise's text), and
// the completion step that runs only when the call succeeded.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <functional>

#include "hopwise/common/error.h"

namespace hopwise::torch_backend {

template <class F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

inline std::function<void(std::exception_ptr)> on_success(std::function<void()> f) {
  return [f = std::move(f)](std::exception_ptr e) {
    if (!e && f) f();
  };
}

}  // namespace hopwise::torch_backend
