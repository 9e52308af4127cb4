/* Links against an installed gpusock and makes one call. Whether a transport
 * can be opened on this machine is beside the point: a clean error is fine. */
#include <gpusock/socket.h>

#include <stdio.h>

int main(void) {
  int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    printf("gs_socket: %d (%s) %s\n", fd, gs_status_name(fd), gs_last_error());
    return 0;
  }
  printf("gs_socket: fd %d\n", fd);
  return gs_close(fd) == 0 ? 0 : 1;
}
