// The one interface every gpusock transport implements (wire/verbs, wire/fabric).
//
// A transport moves bytes and immediates; it knows nothing of sockets or of the
// rsocket protocol. The protocol core (wire/core) decides *what* to post; the
// socket layer (wire/socket) asks the transport to post it and feeds the
// completions back to the core. Every call returns a gs_status_t: >= 0 success,
// < 0 a negated errno; -EAGAIN means "queue full, poll and retry".
#pragma once

#include <gpusock/status.h>

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpusock::wire {

// Registered memory. remote_addr is what a peer must put in an RDMA write to hit
// `base` (a virtual address or an offset, as the provider wants); rkey is the
// 32-bit key the rsocket connection record carries.
struct MemoryRegion {
  void *base = nullptr;
  size_t length = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  void *desc = nullptr;    // provider's local descriptor (fi_mr_desc / ibv_mr*)
  void *handle = nullptr;  // provider's object, owned by the Domain
};

enum MemoryAccess : unsigned {
  kAccessLocal = 0,        // source of local writes only (send buffer)
  kAccessRemoteWrite = 1,  // peers may RDMA-write into it (receive ring, target table)
};

// One RDMA write. With has_imm the peer receives a completion carrying `imm`
// (verbs: write-with-immediate; libfabric: fi_writedata with 8-byte CQ data).
// length may be 0 (control messages that carry only an immediate).
struct WriteRequest {
  const void *local = nullptr;  // inside `region` (or any memory when inline_data)
  const MemoryRegion *region = nullptr;
  uint32_t length = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;
  bool has_imm = true;
  bool inline_data = false;  // small: the transport may copy it at post time
  // The stream's last write: the transport is torn down once it completes, so
  // its completion must mean the peer has it (and everything before it), not
  // only that a local socket took it.
  bool closes = false;
  uint64_t token = 0;  // returned in the completion
};

enum class CompletionKind : uint8_t {
  kWriteDone,  // a posted write finished (status says how)
  kRecvImm,    // a peer's write-with-immediate arrived; one posted receive used
};

struct Completion {
  CompletionKind kind = CompletionKind::kWriteDone;
  gs_status_t status = 0;  // 0 or a negated errno (-EIO, -ECONNRESET, ...)
  uint64_t token = 0;      // kWriteDone: the request's token
  uint32_t imm = 0;        // kRecvImm: host-order immediate
  uint32_t length = 0;     // kRecvImm: bytes placed by that write
};

// Connection-management events, polled separately from data completions.
enum class CmEventKind : uint8_t {
  kNone,
  kEstablished,   // peer_private_data holds the peer's connection record
  kRejected,      // connect refused (no listener: -ECONNREFUSED) or rejected by the peer
  kDisconnected,  // the peer (or the network) ended the connection
  kError,
};

struct CmEvent {
  CmEventKind kind = CmEventKind::kNone;
  gs_status_t status = 0;
  const char *reason = nullptr;  // static text explaining a failure, if the transport has one
  uint8_t peer_private_data[64] = {};
  uint32_t peer_private_len = 0;
};

class Domain;

// One connected (or connecting) endpoint. Not thread-safe: the socket layer
// serialises calls per endpoint.
class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // Active side: start connecting; completes with a CmEvent kEstablished.
  virtual gs_status_t connect(const sockaddr *addr, socklen_t len, const void *private_data, uint32_t private_len) = 0;
  virtual gs_status_t post_write(const WriteRequest &request) = 0;
  // Make room for `count` more incoming immediates (verbs: zero-SGE receives).
  virtual gs_status_t post_recv(uint32_t count) = 0;
  // Up to `max` data completions; returns how many, or < 0 on a fatal error.
  virtual int poll(Completion *out, int max) = 0;
  // At most one CM event; returns 1 if one was written, 0 if none.
  virtual int poll_cm(CmEvent *out) = 0;
  // Tear the connection down (after the in-band disconnect has completed).
  virtual void disconnect() = 0;
  // Largest write the transport posts inline (0 if none).
  virtual uint32_t max_inline() const = 0;
  // Messages from the peer the endpoint can hold before it takes them (shm:
  // the command queue in its region, which a peer's write finding full gets
  // EAGAIN from): the credits it grants and the control messages beside them
  // must fit. Unbounded where the transport queues for itself.
  virtual uint32_t inbound_capacity() const { return UINT32_MAX; }
  virtual gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const = 0;
  virtual gs_status_t peer_address(sockaddr_storage *out, socklen_t *len) const = 0;

  // ---- waiting on events (an idle socket costs no CPU) ----
  // An fd that polls readable (level-triggered; poll/epoll) when poll() or
  // poll_cm() may have something new for this endpoint; -1 when the transport
  // has none (the caller then sleeps in short steps). Stable for the
  // endpoint's life.
  virtual int wait_fd() const { return -1; }
  // Called right before sleeping on wait_fd(): 0 when it is safe to sleep
  // (anything new will make the fd readable), -EAGAIN when something may
  // already be there (poll first, then ask again). It may drain wake-ups
  // already delivered. The transport's fi_trywait.
  virtual gs_status_t arm_wait() { return -EAGAIN; }
  // arm_wait() for a caller that has just polled wait_fd() and found it not
  // readable: a transport whose fd carries wake-up datagrams need not read
  // them first (fabric:shm's bell: a system call saved per endpoint when
  // gs_poll sleeps on hundreds). Default: arm_wait().
  virtual gs_status_t arm_wait_fd_quiet() { return arm_wait(); }
  // A cheap look, no system call and no provider lock: may poll() or
  // poll_cm() find something now? False positives are allowed, false
  // negatives never: a transport without such a look answers true.
  virtual bool maybe_ready() const { return true; }
  // For a caller that looks at many endpoints' wait fds in one system call
  // (gs_poll over hundreds of sockets): true when, as long as wait_fd() does
  // not poll readable, poll() and poll_cm() would find nothing new. The
  // caller may then skip them (on tcp each is a system call) for an endpoint
  // whose fd it has just found quiet. False when only poll() can tell.
  virtual bool quiet_unless_fd_readable() const { return false; }

  // ---- readiness hints (Domain::take_hints) ----
  // This endpoint's slot on its domain's hint board, or -1 when its
  // transport gives no hints for it (look at it every time).
  virtual int32_t hint_slot() const { return -1; }
  // True when poll() and poll_cm() would find nothing new until a hint comes
  // for this endpoint (no blocked send, no verdict or wake-up pending, a peer
  // that marks hints).
  virtual bool quiet_until_hinted() const { return false; }
  // Hints ourselves: a change made here that no peer announces.
  virtual void hint_self() {}
};

// Endpoints one thread sleeps on together (a readiness set's members). The
// transport wakes the group's fd when a watched endpoint may have news, so
// that a sleep over thousands of idle endpoints arms one word instead of
// each endpoint. Not thread-safe: its readiness set serialises calls.
class SleepGroup {
 public:
  virtual ~SleepGroup() = default;
  // Polls readable when the group was woken while armed.
  virtual int fd() const = 0;
  // Starts or stops watching the endpoint with hint slot `slot`.
  virtual void watch(int32_t slot, bool on) = 0;
  // Whether a hint for `slot` wakes this group (it may not when another
  // group of the process watches the same endpoint).
  virtual bool wakes_for(int32_t slot) const = 0;
  // Moves whenever some slot stops waking a group that watches it.
  virtual uint64_t sharing_epoch() const = 0;
  // Before sleeping: armed, then a full fence (take hints after it: a hint
  // that comes after either is taken or wakes the fd).
  virtual void arm() = 0;
  // After sleeping, or instead of it: disarmed, and the fd's wake-ups read
  // when `rung` (the sleep found fd() readable) or a waker took the armed
  // word since arm(); a wake-up that comes later ends the next sleep early,
  // whose poll finds it.
  virtual void disarm(bool rung) = 0;
};

// A connection request seen by a listener, not yet accepted.
class ConnectionRequest {
 public:
  virtual ~ConnectionRequest() = default;
  virtual const uint8_t *private_data() const = 0;
  virtual uint32_t private_len() const = 0;
  // Refuse the request (the peer sees kRejected).
  virtual void reject() = 0;
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Next pending request: 1 and *out set, 0 if none yet, < 0 on error;
  // -EMFILE or -ENFILE while a request waits that this process has no
  // descriptor to take yet (it stays queued; the listener reads as ready).
  virtual int get_request(std::unique_ptr<ConnectionRequest> *out) = 0;
  virtual gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const = 0;
  // Waiting for requests, as Endpoint's calls of the same names (for get_request()).
  virtual int wait_fd() const { return -1; }
  virtual gs_status_t arm_wait() { return -EAGAIN; }
  virtual gs_status_t arm_wait_fd_quiet() { return arm_wait(); }
  virtual bool maybe_ready() const { return true; }
};

// How a listener takes its address, beyond the sockaddr.
struct ListenOptions {
  bool v6only = false;  // IPV6_V6ONLY: an IPv6 wildcard listener takes no IPv4 clients
};

// Queue depths the protocol core needs from an endpoint (its sq_size, its
// receive posts, its inline threshold); a transport may round them up.
struct EndpointAttr {
  uint32_t send_depth = 1024;
  uint32_t recv_depth = 1024;
  uint32_t inline_size = 64;
};

// Capabilities are data, as in libfabric's *_attr.c tables.
struct TransportCaps {
  const char *name = "";          // "fabric:tcp", "fabric:shm", "verbs"
  bool device_memory = false;     // may register GPU memory (FI_HMEM / dmabuf): ask device_memory_support()
  bool needs_recv_posts = true;   // immediates consume posted receives
  bool write_with_imm = true;     // false: iWARP-style write + 4-byte send
  uint32_t max_private_data = 0;  // bytes a connect/accept can carry
  // A connection request may wait unread for as long as the listener's
  // process takes (GS_ACCEPT_ON_DEMAND). Not with rdma_cm: a request left
  // unanswered past its CM timeout fails at the client.
  bool requests_wait = true;
  // An established endpoint's quiet wait fd may stand for an idle endpoint
  // (Endpoint::quiet_unless_fd_readable can be true): worth polling many of
  // those fds in one system call instead of polling each endpoint.
  bool quiet_fd_means_idle = false;
  // Registering memory pins it against RLIMIT_MEMLOCK (verbs): a process
  // without a generous limit should not grow rings it need not (ring_budget.h).
  bool registration_pins = false;
};

// Can this domain register GPU memory, and if not, why: the answer a GPU proxy
// prints at start. Found out when asked, not at open: the probe opens provider
// objects and registers a real GPU buffer, which a CPU-only process should not
// pay for.
struct DeviceMemorySupport {
  bool registers = false;  // the transport's library registers CUDA memory
  std::string why;         // one phrase: how it does, or what is missing
};

// A provider instance: memory registration and endpoint creation.
class Domain {
 public:
  virtual ~Domain() = default;
  virtual const TransportCaps &caps() const = 0;
  // gpu_buffer: `length` bytes of GPU memory on CUDA device `cuda_device` the
  // probe may try to register.
  virtual DeviceMemorySupport device_memory_support(void *gpu_buffer, size_t length, int cuda_device) {
    (void)gpu_buffer, (void)length, (void)cuda_device;
    return {false, std::string(caps().name) + ": no GPU memory registration"};
  }
  virtual gs_status_t register_memory(void *base, size_t length, unsigned access, MemoryRegion *out) = 0;
  virtual void deregister_memory(MemoryRegion *region) = 0;
  // request == nullptr: an endpoint for connect(); else one that will accept it.
  virtual gs_status_t create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) = 0;
  // The same, sized for the core's queues; transports that size nothing ignore it.
  virtual gs_status_t create_endpoint(ConnectionRequest *request, const EndpointAttr &,
                                      std::unique_ptr<Endpoint> *out) {
    return create_endpoint(request, out);
  }
  // Passive side: accept `request` on `endpoint` with our record as private data;
  // completes with a CmEvent kEstablished on that endpoint.
  virtual gs_status_t accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                             uint32_t private_len) = 0;
  virtual gs_status_t listen(const sockaddr *addr, socklen_t len, int backlog, std::unique_ptr<Listener> *out) = 0;
  // The same with options; transports that have no use for them ignore them.
  virtual gs_status_t listen(const sockaddr *addr, socklen_t len, int backlog, const ListenOptions &,
                             std::unique_ptr<Listener> *out) {
    return listen(addr, len, backlog, out);
  }
  // Why this thread's last failing call failed, in words, when the transport
  // knows more than the status says (e.g. which process holds a port);
  // empty otherwise.
  virtual std::string last_error_detail() const { return {}; }
  // Of the slots (Endpoint::hint_slot) set in mask[0..words) (slot s is bit
  // s % 64 of word s / 64), appends those hinted since they were last taken,
  // and takes their hints; a transport without hints appends nothing. An
  // event loop then looks at those endpoints instead of at every endpoint.
  virtual void take_hints(const uint64_t *mask, size_t words, std::vector<int32_t> *slots) {
    (void)mask, (void)words, (void)slots;
  }
  // A group to sleep on many hinted endpoints at once, or nullptr when the
  // transport has none (sleep on each endpoint's wait_fd).
  virtual std::unique_ptr<SleepGroup> open_sleep_group() { return nullptr; }
};

// Opens the transport named by `spec` ("verbs", "fabric:tcp", "fabric:shm"; empty:
// GPUSOCK_TRANSPORT, else verbs if a device exists, else fabric:tcp). On failure
// `error` says what is missing (no provider, no device).
gs_status_t open_domain(const std::string &spec, std::unique_ptr<Domain> *out, std::string *error);

}  // namespace gpusock::wire
