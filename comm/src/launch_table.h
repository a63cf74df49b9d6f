// What launch.cpp and launch_table.cpp share: the scheme an address belongs to.
#pragma once

#include <string>

#include "hopwise/comm/launch.h"

namespace hopwise::comm {

// The scheme of a store address; InvalidArgument "`what` is not a store address; use ..." (the known forms) where
// none matches.
StoreScheme store_scheme_of(const std::string& address, const std::string& what);

}  // namespace hopwise::comm
