// Host-side helpers of the GPU socket tests: spawned peer processes, ports,
// memory both the kernel and the test read, waiting with deadlines.
#pragma once

#include <gpusock/gpu.cuh>

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char **environ;

namespace gpusock::test {

using Clock = std::chrono::steady_clock;

// The peer program: $GPUSOCK_TEST_PEER, else gpu_test_peer beside this binary
// (so a build folder copied to another machine still finds it).
inline std::string peer_binary() {
  if (const char *env = std::getenv("GPUSOCK_TEST_PEER"); env && *env) return env;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "gpu_test_peer";
  self[n] = '\0';
  std::string dir(self);
  return dir.substr(0, dir.rfind('/')) + "/gpu_test_peer";
}

// A spawned peer process (posix_spawn: no fork after the transport is open),
// terminated, then killed, when it goes out of scope.
class Peer {
 public:
  // gpu_test_peer with args, or `program` with args.
  explicit Peer(std::vector<std::string> args, const std::string &program = "") {
    args.insert(args.begin(), program.empty() ? peer_binary() : program);
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~Peer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    if (!wait_exit(5000)) {
      kill(pid_, SIGKILL);
      wait_exit(5000);
    }
  }
  Peer(const Peer &) = delete;
  Peer &operator=(const Peer &) = delete;
  bool started() const { return pid_ > 0 || exited_; }
  void kill9() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  // Waits up to ms for the exit; true (and the exit code, or 128+signal) if it exited.
  bool wait_exit(int ms, int *code = nullptr) {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      if (pid_ > 0) {
        int st = 0;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
          code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
          pid_ = -1;
          exited_ = true;
        }
      }
      if (exited_) {
        if (code) *code = code_;
        return true;
      }
      if (Clock::now() >= end) return false;
      usleep(2000);
    }
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

inline std::string self_binary() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  return self;
}

inline int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

// Memory a kernel and the test both use, on either backend: host-mapped pinned
// memory under CUDA (the test may read it while the kernel runs), plain memory
// on the host backend.
class SharedMemory {
 public:
  SharedMemory() = default;
  SharedMemory(const SharedMemory &) = delete;
  SharedMemory &operator=(const SharedMemory &) = delete;
  ~SharedMemory() {
    for (void *p : blocks_) {
#if defined(__CUDACC__)
      cudaFreeHost(p);
#else
      std::free(p);
#endif
    }
  }
  template <class T>
  T *alloc(size_t count) {
    const size_t bytes = ((count * sizeof(T)) + 4095) & ~size_t(4095);
    void *p = nullptr;
#if defined(__CUDACC__)
    if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) return nullptr;
#else
    p = std::aligned_alloc(4096, bytes);
    if (!p) return nullptr;
#endif
    std::memset(p, 0, bytes);
    blocks_.push_back(p);
    return static_cast<T *>(p);
  }

 private:
  std::vector<void *> blocks_;
};

template <class T>
T load_shared(const T *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

// Polls pred until it holds or ms pass.
template <class Pred>
bool wait_until(Pred pred, int ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (Clock::now() >= end) return false;
    usleep(1000);
  }
  return true;
}

}  // namespace gpusock::test
