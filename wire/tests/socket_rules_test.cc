// The rules every gpusock socket applies (wire/socket_rules.h): the CPU
// sockets and the proxy's GPU sockets both take them from there.
#include "wire/socket_rules.h"

#include <gtest/gtest.h>

namespace {

using namespace gpusock::wire::rules;

TEST(SocketRules, BacklogIsAtLeastOneAndAtMostTheLimit) {
  EXPECT_EQ(clamp_backlog(-5), 1);
  EXPECT_EQ(clamp_backlog(0), 1);
  EXPECT_EQ(clamp_backlog(7), 7);
  EXPECT_EQ(clamp_backlog(kMaxBacklog + 1), kMaxBacklog);
}

TEST(SocketRules, AddressesOfTheRightFamilyAndLengthPass) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  const auto *a4 = reinterpret_cast<const sockaddr *>(&v4);
  const auto *a6 = reinterpret_cast<const sockaddr *>(&v6);
  EXPECT_EQ(check_address(a4, sizeof v4, AF_INET), 0);
  EXPECT_EQ(check_address(a6, sizeof v6, AF_INET6), 0);
  EXPECT_EQ(check_address(a4, sizeof v4, AF_UNSPEC), 0);
  EXPECT_EQ(check_address(a6, sizeof v6, AF_UNSPEC), 0);
}

TEST(SocketRules, BadAddressesFailAsLinuxFailsThem) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  const auto *a4 = reinterpret_cast<const sockaddr *>(&v4);
  EXPECT_EQ(check_address(nullptr, sizeof v4, AF_INET), -EINVAL);
  EXPECT_EQ(check_address(a4, 1, AF_INET), -EINVAL);              // not even the family
  EXPECT_EQ(check_address(a4, sizeof v4 - 1, AF_INET), -EINVAL);  // short
  EXPECT_EQ(check_address(a4, sizeof(sockaddr_storage) + 1, AF_INET), -EINVAL);
  EXPECT_EQ(check_address(a4, sizeof v4, AF_INET6), -EAFNOSUPPORT);  // another family than the socket's
  sockaddr unix_addr{};
  unix_addr.sa_family = AF_UNIX;
  EXPECT_EQ(check_address(&unix_addr, sizeof unix_addr, AF_UNSPEC), -EAFNOSUPPORT);
}

TEST(SocketRules, UnboundListenersGetAnyAddressOfTheirFamily) {
  sockaddr_storage ss;
  std::memset(&ss, 0xff, sizeof ss);
  EXPECT_EQ(any_address(AF_INET, &ss), sizeof(sockaddr_in));
  EXPECT_EQ(ss.ss_family, AF_INET);
  EXPECT_EQ(reinterpret_cast<sockaddr_in *>(&ss)->sin_port, 0);
  EXPECT_EQ(reinterpret_cast<sockaddr_in *>(&ss)->sin_addr.s_addr, 0u);
  EXPECT_EQ(any_address(AF_INET6, &ss), sizeof(sockaddr_in6));
  EXPECT_EQ(ss.ss_family, AF_INET6);
}

TEST(SocketRules, RingsAreAtLeastAPage) {
  EXPECT_EQ(send_ring_size(0), kMinSendRing);
  EXPECT_EQ(send_ring_size(1 << 20), 1u << 20);
  EXPECT_EQ(receive_ring_size(0), 4096u);
  EXPECT_EQ(receive_ring_size(8193), 8192u);  // even: two halves
}

}  // namespace
