// What a StreamSocket needs from the process around it, handed to it when it
// is built: the socket files then sit below the engine that provides it
// (engine.h) instead of reaching up to a singleton. An accepted socket gets
// its listener's context.
#pragma once

#include <cstddef>

namespace gpusock::socket {

struct SocketOptions;
class RingBudget;
class RegCache;

class SocketContext {
 public:
  // A new socket's options (rsocket's defaults, wire/config.h).
  virtual const SocketOptions &default_options() const = 0;
  // Grown rings for connections whose ring sizes nobody chose (ring_budget.h).
  virtual RingBudget &ring_budget() = 0;
  // The socket gained work for the background thread (a listener, a connect
  // under way, bytes waiting for credits, keepalive, a close).
  virtual void kick() = 0;
  // How long a close without SO_LINGER may flush.
  virtual int close_flush_seconds() const = 0;
  // Zero-copy sends: the smallest send that uses them (0: off), and the
  // registration cache (nullptr when they cannot be done here).
  virtual size_t zcopy_min() const = 0;
  virtual RegCache *reg_cache() = 0;

 protected:
  ~SocketContext() = default;  // not deleted through this interface
};

}  // namespace gpusock::socket
