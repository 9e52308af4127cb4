// Compiled, never run: the installed device API header and every header it
// includes are found under the prefix.
#include <gpusock/gpu.cuh>

unsigned consumer_device_api_context_size = sizeof(gpusock::DeviceContext);
