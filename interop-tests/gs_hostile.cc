// gs_hostile: a DELIBERATELY MISBEHAVING rsocket peer, built only for the
// interop matrix's bad-input cases. It is not a socket: it drives gpusock's
// transport interface (wire/transport.h) over the real verbs transport
// (wire/verbs) and crafts connection records and immediates with wire/core, so
// it can say exactly the wrong thing on the wire. The victim is a gpusock
// process (gs_xfer_peer victim) that must close this one connection with an
// error code while its other connections go on.
//
// Client cases (attack a gpusock server at --addr/--port):
//   version2           connection record with version 2          → rejected
//   short-record       8 bytes of private data, not a record      → rejected
//   bad-advert         after connecting, advertise an SGL (same rkey, valid
//                      memory!) outside the ring we declared, then make the
//                      victim send                                 → victim closes;
//                      the canary memory behind our ring stays untouched
//   credits-backwards  a credit immediate lower than the last one → victim closes
//   credits-overflow   credits beyond our receive queue depth     → victim closes
//   write-past         one RDMA write of (advertised half + 1) bytes into the
//                      victim's first half (inside its MR)        → victim closes
//   iomap-imm          an iomap-update immediate (none was offered) → victim closes
//   bad-rkey           a record whose ring rkey is bogus, then make the victim
//                      send: its write ends in a remote access error completion
//                                                                  → victim closes
// Server cases (a gpusock client connects to us):
//   serve-version2     accept with a version-2 record
//   serve-garbage      accept with no private data (not an rsocket at all)
//
// Prints "RESULT <case>: ..." and exits 0 when the victim reacted as it must
// (reject, or close the connection within --wait seconds), 1 otherwise.
#include "interop-tests/common.h"

#include "wire/core/conn_record.h"
#include "wire/core/immediate.h"
#include "wire/transport.h"
#include "wire/verbs/verbs_transport.h"

#include <sys/mman.h>

#include <memory>

using namespace interop;
namespace w = gpusock::wire;

namespace {

constexpr uint32_t kHalf = 4096;    // our declared ring: 2 halves of 4 KiB
constexpr uint32_t kCanary = 8192;  // registered memory right behind it
constexpr uint8_t kCanaryByte = 0xC5;
constexpr uint16_t kCredits = 64;  // data credits we grant (our rq depth)
constexpr uint32_t kRecvPosts = kCredits + 4 + 64;

std::string g_case;

[[noreturn]] void finish(bool pass, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void finish(bool pass, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::printf("RESULT %s %s: %s\n", pass ? "PASS" : "FAIL", g_case.c_str(), msg);
  std::fflush(stdout);
  std::exit(pass ? 0 : 1);
}

void *page_alloc(size_t n) {
  void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) finish(false, "mmap failed");
  return p;
}

// Enough for one write past the largest half a gpusock victim advertises by
// default (grown 4 MiB rings: wire/socket/ring_budget.h) and then some.
constexpr uint32_t kSendBytes = 8u << 20;

struct Peer {
  std::unique_ptr<w::Domain> domain;
  std::unique_ptr<w::Endpoint> ep;
  uint8_t *ring = nullptr;  // kHalf * 2 + kCanary, one registration
  uint8_t *meta = nullptr;  // our target table (2 × 16 B) + staging
  uint8_t *sbuf = nullptr;  // data we send
  w::MemoryRegion ring_mr{}, meta_mr{}, sbuf_mr{};
  w::ConnRecord victim{};
  uint64_t token = 1;
  int write_errors = 0, recv_errors = 0, recvs = 0, writes_done = 0, writes_posted = 0;
  int unknown_token = 0;  // write completions whose token we never posted

  void open() {
    std::string err;
    if (int rc = w::verbs::open_verbs_domain(&domain, &err); rc < 0)
      finish(false, "cannot open the verbs transport: %s (%s)", errname(rc), err.c_str());
    ring = static_cast<uint8_t *>(page_alloc(2 * kHalf + kCanary));
    meta = static_cast<uint8_t *>(page_alloc(4096));
    sbuf = static_cast<uint8_t *>(page_alloc(kSendBytes));
    std::memset(ring + 2 * kHalf, kCanaryByte, kCanary);
    PatternStream(77).fill(sbuf, kSendBytes);
    if (domain->register_memory(ring, 2 * kHalf + kCanary, w::kAccessRemoteWrite, &ring_mr) < 0 ||
        domain->register_memory(meta, 4096, w::kAccessRemoteWrite, &meta_mr) < 0 ||
        domain->register_memory(sbuf, kSendBytes, w::kAccessLocal, &sbuf_mr) < 0)
      finish(false, "memory registration failed");
  }

  w::ConnRecord our_record(uint8_t version, bool bogus_rkey) const {
    w::ConnRecord r;
    r.version = version;
    r.flags = w::local_conn_flags();
    r.credits = kCredits;
    r.target_iomap_size = 0;
    r.target_sgl = {meta_mr.remote_addr, meta_mr.rkey, w::kSglSize};
    r.data_buf = {ring_mr.remote_addr, bogus_rkey ? (ring_mr.rkey ^ 0x00A5A500u) : ring_mr.rkey, kHalf};
    return r;
  }

  w::EndpointAttr attr() const {
    w::EndpointAttr a;
    a.send_depth = 64;
    a.recv_depth = kRecvPosts;
    a.inline_size = 64;
    return a;
  }

  // Drains data completions, noting errors. Returns how many it saw.
  int drain() {
    w::Completion c[32];
    const int n = ep ? ep->poll(c, 32) : 0;
    for (int i = 0; i < n; ++i) {
      if (c[i].kind == w::CompletionKind::kWriteDone) {
        ++writes_done;
        if (c[i].token == 0 || c[i].token >= token) ++unknown_token;
        if (c[i].status) ++write_errors;
      } else {
        ++recvs;
        if (c[i].status) ++recv_errors;
      }
    }
    return n;
  }

  // Waits for one CM event (other than kNone) up to `secs`.
  w::CmEvent wait_cm(double secs) {
    const double end = now_s() + secs;
    w::CmEvent ev;
    while (now_s() < end) {
      drain();
      if (ep->poll_cm(&ev) > 0 && ev.kind != w::CmEventKind::kNone) return ev;
      sleep_ms(2);
    }
    ev.kind = w::CmEventKind::kNone;
    return ev;
  }

  void write(const void *local, const w::MemoryRegion *mr, uint32_t len, uint64_t raddr, uint32_t rkey, uint32_t imm) {
    w::WriteRequest r;
    r.local = local;
    r.region = mr;
    r.length = len;
    r.remote_addr = raddr;
    r.rkey = rkey;
    r.imm = imm;
    r.has_imm = true;
    r.token = token++;
    for (int tries = 0;; ++tries) {
      const int rc = ep->post_write(r);
      if (rc == 0) {
        ++writes_posted;
        return;
      }
      if (rc != -EAGAIN || tries > 1000) finish(false, "post_write failed: %s", errname(rc));
      drain();
      sleep_ms(1);
    }
  }

  // A legitimate data message into the victim's first advertised half.
  void send_data(uint32_t len) {
    write(sbuf, &sbuf_mr, len, victim.data_buf.addr, victim.data_buf.key, w::imm_data(len));
  }

  bool canary_intact(size_t *first_bad) const {
    for (size_t i = 0; i < kCanary; ++i)
      if (ring[2 * kHalf + i] != kCanaryByte) return *first_bad = i, false;
    return true;
  }
};

int run_client(const std::string &kase, const sockaddr_in &addr, double wait_s) {
  Peer p;
  p.open();
  const bool bogus_rkey = kase == "bad-rkey";
  const uint8_t version = kase == "version2" ? 2 : w::kRsVersion;
  uint8_t rec[w::kConnRecordSize];
  w::encode_conn_record(p.our_record(version, bogus_rkey), rec);
  uint32_t rec_len = w::kConnRecordSize;
  if (kase == "short-record") {
    std::memcpy(rec, "NOTRSOCK", 8);
    rec_len = 8;
  }
  if (int rc = p.domain->create_endpoint(nullptr, p.attr(), &p.ep); rc < 0)
    finish(false, "create_endpoint: %s", errname(rc));
  if (int rc = p.ep->post_recv(kRecvPosts); rc < 0) finish(false, "post_recv: %s", errname(rc));
  const double t_connect = now_s();
  if (int rc = p.ep->connect(reinterpret_cast<const sockaddr *>(&addr), sizeof addr, rec, rec_len); rc < 0)
    finish(false, "connect: %s", errname(rc));
  const w::CmEvent ev = p.wait_cm(15);

  if (kase == "version2" || kase == "short-record") {
    if (ev.kind == w::CmEventKind::kRejected)
      finish(true, "victim rejected the connection (%s) after %.2fs", errname(ev.status), now_s() - t_connect);
    finish(false, "expected a reject, got CM event kind %d status %s", static_cast<int>(ev.kind), errname(ev.status));
  }
  if (ev.kind != w::CmEventKind::kEstablished)
    finish(false, "connect did not complete: CM event kind %d status %s", static_cast<int>(ev.kind),
           errname(ev.status));
  w::RecordError why;
  if (w::decode_conn_record(ev.peer_private_data, ev.peer_private_len, &p.victim, &why) < 0)
    finish(false, "the victim's record is invalid: %s", w::record_error_text(why));
  const bool victim_be = (p.victim.flags & w::kConnFlagNet) != 0;
  std::printf("hostile: connected; victim grants %u credits, first half %u bytes at 0x%" PRIx64 "\n", p.victim.credits,
              p.victim.data_buf.length, p.victim.data_buf.addr);
  sleep_ms(200);  // let the victim's first advert and credit update arrive
  p.drain();

  std::string did;
  const uint64_t table = p.victim.target_sgl.addr;
  const uint32_t table_key = p.victim.target_sgl.key;
  if (kase == "bad-advert") {
    // Slot 1 of the victim's target table (slot 0 came with our record): an
    // SGL pointing at the canary right behind our declared ring. Same rkey and
    // registered memory, so only the victim's own bounds check can stop it.
    w::SglEntry outside{p.ring_mr.remote_addr + 2 * kHalf, p.ring_mr.rkey, kHalf};
    uint8_t *stage = p.meta + 256;
    w::encode_sgl_record(outside, victim_be, stage);
    p.write(stage, &p.meta_mr, w::kSglRecordSize, table + w::kSglRecordSize, table_key, w::imm_credits(kCredits));
    // Now make the victim (an echo server) send 3 halves' worth: the first
    // half fills our declared slot 0, the rest would go to the bad advert.
    p.send_data(3 * kHalf);
    did = "advertised an SGL 8 KiB past our ring (same rkey) and sent 12 KiB to echo";
  } else if (kase == "credits-backwards") {
    p.write(nullptr, nullptr, 0, table, table_key, w::imm_credits(kCredits - 54));
    did = "sent credit sequence 10 after granting 64";
  } else if (kase == "credits-overflow") {
    p.write(nullptr, nullptr, 0, table, table_key, w::imm_credits(kCredits + 100));
    did = "sent credit sequence 164 with a receive queue of 64";
  } else if (kase == "iomap-imm") {
    p.write(nullptr, nullptr, 0, table, table_key, w::make_imm(w::ImmOp::kIomapSgl, 0));
    did = "sent an iomap-update immediate though the victim offered no iomap table";
  } else if (kase == "write-past") {
    const uint32_t n = p.victim.data_buf.length + 1;
    if (n > kSendBytes) finish(false, "victim's half (%u) is larger than our send buffer", n - 1);
    p.write(p.sbuf, &p.sbuf_mr, n, p.victim.data_buf.addr, p.victim.data_buf.key, w::imm_data(n));
    did = "wrote " + std::to_string(n) + " bytes at the start of a " + std::to_string(n - 1) + "-byte advertised half";
  } else if (kase == "bad-rkey") {
    p.send_data(100);
    did = "declared a bogus rkey for our ring and sent 100 bytes to echo";
  } else {
    finish(false, "unknown case");
  }

  // The victim must now end this connection (it calls rdma_disconnect: we see
  // a CM DISCONNECTED event).
  const double t_attack = now_s();
  const w::CmEvent after = p.wait_cm(wait_s);
  const double dt = now_s() - t_attack;
  size_t bad = 0;
  const bool canary = p.canary_intact(&bad);
  char tail[384];
  std::snprintf(tail, sizeof tail,
                "; we posted %d write(s); our transport reported %d write completion(s) (%d failed, %d with a token "
                "we never used) and %d received immediate(s) (%d failed)",
                p.writes_posted, p.writes_done, p.write_errors, p.unknown_token, p.recvs, p.recv_errors);
  if (!canary)
    finish(false, "%s: the victim WROTE OUTSIDE our declared ring (canary byte %zu changed)%s", did.c_str(), bad, tail);
  if (after.kind != w::CmEventKind::kDisconnected)
    finish(false, "%s: the victim did not close the connection within %.0fs (CM event kind %d)%s", did.c_str(), wait_s,
           static_cast<int>(after.kind), tail);
  finish(true, "%s: victim closed the connection after %.2fs; canary behind our ring intact%s", did.c_str(), dt, tail);
}

int run_server(const std::string &kase, const sockaddr_in &addr, double wait_s) {
  Peer p;
  p.open();
  std::unique_ptr<w::Listener> listener;
  if (int rc = p.domain->listen(reinterpret_cast<const sockaddr *>(&addr), sizeof addr, 4, &listener); rc < 0)
    finish(false, "listen: %s", errname(rc));
  std::printf("hostile: listening\n");
  std::fflush(stdout);
  std::unique_ptr<w::ConnectionRequest> req;
  const double end = now_s() + 30;
  while (listener->get_request(&req) <= 0) {
    if (now_s() > end) finish(false, "no connection request within 30s");
    sleep_ms(5);
  }
  if (int rc = p.domain->create_endpoint(req.get(), p.attr(), &p.ep); rc < 0)
    finish(false, "create_endpoint: %s", errname(rc));
  p.ep->post_recv(kRecvPosts);
  uint8_t rec[w::kConnRecordSize];
  uint32_t len = w::kConnRecordSize;
  if (kase == "serve-version2") {
    w::encode_conn_record(p.our_record(2, false), rec);
  } else {
    len = 0;  // not an rsocket: no record at all
  }
  if (int rc = p.domain->accept(p.ep.get(), req.get(), len ? rec : nullptr, len); rc < 0)
    finish(false, "accept: %s", errname(rc));
  const w::CmEvent ev = p.wait_cm(10);
  if (ev.kind != w::CmEventKind::kEstablished)
    finish(false, "accept did not complete: CM event kind %d", static_cast<int>(ev.kind));
  const w::CmEvent after = p.wait_cm(wait_s);
  if (after.kind != w::CmEventKind::kDisconnected)
    finish(false, "the gpusock client kept the connection with a %s peer", len ? "version-2" : "record-less");
  finish(true, "accepted with %s; the gpusock client disconnected", len ? "a version-2 record" : "no record");
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s CASE --addr A --port P [--wait S]\n"
                 "CASE: version2 short-record bad-advert credits-backwards credits-overflow write-past iomap-imm\n"
                 "      bad-rkey | serve-version2 serve-garbage\n",
                 argv[0]);
    return 2;
  }
  g_case = argv[1];
  Args a(argc, argv, 2);
  const std::string host = a.str("addr", std::getenv("RDMA_VM_ADDR") ? std::getenv("RDMA_VM_ADDR") : "127.0.0.1");
  const sockaddr_in addr = make_addr(host.c_str(), static_cast<int>(a.num("port", 7471)));
  const double wait_s = static_cast<double>(a.num("wait", 10));
  if (g_case.rfind("serve-", 0) == 0) return run_server(g_case, addr, wait_s);
  return run_client(g_case, addr, wait_s);
}
