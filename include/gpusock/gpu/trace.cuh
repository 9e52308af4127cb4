// gpusock device API: trace points on the data path. The leader of a call
// marks each step (a poll of the status line, the bytes seen, copied, the
// request's ticket, the request stored). A program that defines
// GPUSOCK_TRACE(point) before it includes gpusock/gpu.cuh gets a call there
// (gpu/bench/gpu_trace.cu timestamps them to split a round trip into its
// PCIe reads and writes); everyone else gets nothing, not even a branch.
// A GPU thread waits for a load only where it uses the value: each point sits
// after a branch on what it reports, so it marks the load's return, not issue.
#ifndef GPUSOCK_GPU_TRACE_CUH
#define GPUSOCK_GPU_TRACE_CUH

namespace gpusock::trace {

enum Point : int {
  kRecvPollIssued = 0,  // recv: a read of the status line is about to go out
  kRecvPolled,          // recv: ... and came back with nothing to read
  kRecvSeen,            // recv: ... and came back with bytes to read
  kRecvCopied,          // recv: every thread of the scope has copied them
  kRecvDone,            // recv: the leader's bookkeeping done, the call returns
  kSendCalled,          // send: the leader has entered the call
  kSendPlanned,         // send: the leader knows where the bytes go
  kRequestBegin,        // push_request: entered with the request made
  kRequestTicket,       // push_request: ticket taken, room on the ring known
  kRequestStored,       // push_request: the entry's first line issued (stores
                        // do not wait: it reaches the host later)
  kPoints
};

}  // namespace gpusock::trace

#ifndef GPUSOCK_TRACE
#define GPUSOCK_TRACE(point) \
  do {                       \
  } while (0)
#endif

#endif
