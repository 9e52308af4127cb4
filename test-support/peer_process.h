// Peer processes of tests and benchmarks: posix_spawn'ed (never fork: the
// parent may have a transport open), optionally with pipes to their stdin and
// from their stdout, stopped and reaped when they go out of scope.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "test-support/timing.h"

extern char **environ;

namespace gpusock::test {

// This program's binary, "" if unknown.
inline std::string self_binary() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  return self;
}

// The program `name` in the folder of this one (so that a build folder copied
// to another machine still finds its peers); `name` alone if that is unknown.
inline std::string sibling_binary(const std::string &name) {
  const std::string self = self_binary();
  return self.empty() ? name : self.substr(0, self.rfind('/') + 1) + name;
}

// Which of a peer's standard streams the parent holds the other end of.
struct PeerPipes {
  bool in = false;   // PeerProcess::stdin_fd() writes to its stdin
  bool out = false;  // PeerProcess::read_line() reads its stdout
};

class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(const std::string &program, const std::vector<std::string> &args, PeerPipes pipes = {}) {
    spawn(program, args, pipes);
  }
  ~PeerProcess() { stop(); }
  PeerProcess(const PeerProcess &) = delete;
  PeerProcess &operator=(const PeerProcess &) = delete;

  // Starts `program args...`; false (and why in *error) if it could not.
  bool spawn(const std::string &program, const std::vector<std::string> &args, PeerPipes pipes,
             std::string *error = nullptr) {
    int out[2] = {-1, -1}, in[2] = {-1, -1};
    if ((pipes.out && pipe2(out, O_CLOEXEC) != 0) || (pipes.in && pipe2(in, O_CLOEXEC) != 0)) {
      if (error) *error = std::string("pipe: ") + std::strerror(errno);
      close_pair(out);
      return false;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (pipes.out) posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    if (pipes.in) posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    std::vector<std::string> words{program};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char *> argv;
    for (auto &w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close_fd(&out[1]);
    close_fd(&in[0]);
    if (rc != 0) {
      pid_ = -1;
      close_fd(&out[0]);
      close_fd(&in[1]);
      if (error) *error = "spawn " + program + ": " + std::strerror(rc);
      return false;
    }
    out_fd_ = out[0];
    in_fd_ = in[1];
    return true;
  }

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return in_fd_; }
  void kill9() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }

  // Waits up to ms for the exit; true (and the exit code, or 128+signal) if it exited.
  bool wait_exit(int ms, int *code = nullptr) {
    const Deadline deadline(ms / 1000.0);
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
      if (pid_ <= 0 || deadline.passed()) return false;
      usleep(2000);
    }
  }

  // The next line of its stdout without the newline; false at EOF or when
  // timeout_s passes first.
  bool read_line(std::string *line, double timeout_s) {
    const Deadline deadline(timeout_s);
    for (;;) {
      const size_t newline = out_buf_.find('\n');
      if (newline != std::string::npos) {
        *line = out_buf_.substr(0, newline);
        out_buf_.erase(0, newline + 1);
        return true;
      }
      if (out_fd_ < 0 || deadline.passed()) return false;
      pollfd p{out_fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(deadline.ms_left(), 1000)));
      if (ready < 0 && errno != EINTR) return false;
      if (ready <= 0) continue;
      char chunk[512];
      const ssize_t n = ::read(out_fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      out_buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Stops reading its stdout: what it prints later goes to a closed pipe.
  void close_stdout() {
    close_fd(&out_fd_);
    out_buf_.clear();
  }

  // Closes its stdin, gives it grace_ms to leave by itself, then SIGTERM, and
  // SIGKILL if it is still there 5 s later.
  void stop(int grace_ms = 0) {
    close_fd(&in_fd_);
    if (pid_ > 0 && !wait_exit(grace_ms)) {
      kill(pid_, SIGTERM);
      if (!wait_exit(5000)) {
        kill(pid_, SIGKILL);
        wait_exit(5000);
      }
    }
    close_stdout();
  }

 private:
  static void close_fd(int *fd) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  static void close_pair(int fds[2]) {
    close_fd(&fds[0]);
    close_fd(&fds[1]);
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  std::string out_buf_;
};

}  // namespace gpusock::test
