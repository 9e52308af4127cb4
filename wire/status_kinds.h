// Statuses that name a resource this process or the system ran out of: the
// request itself was fine and may succeed once some are freed, so callers
// report them as they are (where a kernel would) instead of as a refusal or
// a reset. Negated errno values, as every status (include/gpusock/status.h).
#pragma once

#include <gpusock/status.h>

namespace gpusock::wire {

// No descriptor left, in this process (EMFILE) or the system (ENFILE).
constexpr bool out_of_descriptors(gs_status_t status) { return status == -EMFILE || status == -ENFILE; }

// The same, or no memory.
constexpr bool out_of_resources(gs_status_t status) { return out_of_descriptors(status) || status == -ENOMEM; }

}  // namespace gpusock::wire
