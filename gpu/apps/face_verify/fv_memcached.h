// memcached's text protocol, the part face verification speaks: `get` of one
// key and `set`. Pure functions over byte buffers (no I/O), for the CPU and
// the GPU alike.
//
//   get <key>\r\n                 ->  VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\nEND\r\n
//                                     END\r\n                       (miss)
//   set <key> 0 0 <bytes>\r\n<data>\r\n   ->  STORED\r\n
// Anything else (ERROR, SERVER_ERROR ..., another key, a bad number, missing
// terminators) is an error: the connection cannot be trusted any more.
#ifndef FV_MEMCACHED_H
#define FV_MEMCACHED_H

#include <gpusock/hd.h>

#include "fv_record.h"

#include <stddef.h>
#include <stdint.h>

namespace fv {

inline constexpr size_t kMcMaxLine = 128;  // a VALUE line longer than this is garbage

// Room a get command needs: "get " + key + "\r\n".
inline constexpr size_t kMcMaxGetBytes = 4 + kMaxKeyBytes + 2;

GS_HD size_t mc_append(char *out, const char *s, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = s[i];
  return n;
}

// "get <key>\r\n" into out (kMcMaxGetBytes); returns its length.
GS_HD size_t mc_format_get(char *out, const char *key, size_t key_len) {
  size_t n = mc_append(out, "get ", 4);
  n += mc_append(out + n, key, key_len);
  return n + mc_append(out + n, "\r\n", 2);
}

// "set <key> 0 0 <bytes>\r\n" into out (kMcMaxLine); returns its length.
GS_HD size_t mc_format_set_line(char *out, const char *key, size_t key_len, size_t bytes) {
  size_t n = mc_append(out, "set ", 4);
  n += mc_append(out + n, key, key_len);
  n += mc_append(out + n, " 0 0 ", 5);
  n += format_uint(out + n, bytes);
  return n + mc_append(out + n, "\r\n", 2);
}

enum McStatus : int {
  kMcNeedMore = 0,  // a prefix of a valid reply; read more
  kMcHit = 1,
  kMcMiss = 2,
  kMcStored = 3,
  kMcError = -1,
};

struct McReply {
  McStatus status;
  size_t total;        // bytes of the whole reply once known (need-more: 0 or the expected total)
  size_t data_offset;  // kMcHit: where the value starts
  size_t data_len;
};

namespace detail {

// Whether buf[0, n) is a prefix of lit (len bytes) or lit a prefix of it.
GS_HD bool agrees(const uint8_t *buf, size_t n, const char *lit, size_t len) {
  for (size_t i = 0; i < n && i < len; ++i)
    if (buf[i] != static_cast<uint8_t>(lit[i])) return false;
  return true;
}

// A decimal field at buf[*pos, end) up to the next ' ' or '\r'. False on no
// digit, a non-digit, or a value over max.
GS_HD bool parse_decimal(const uint8_t *buf, size_t end, size_t *pos, uint64_t max, uint64_t *out) {
  uint64_t v = 0;
  size_t i = *pos, digits = 0;
  for (; i < end && buf[i] != ' ' && buf[i] != '\r'; ++i, ++digits) {
    if (buf[i] < '0' || buf[i] > '9' || digits >= 19) return false;
    v = v * 10 + (buf[i] - '0');
    if (v > max) return false;
  }
  if (digits == 0) return false;
  *pos = i;
  *out = v;
  return true;
}

}  // namespace detail

// Parses the reply to "get <key>" at the start of buf (n bytes so far). Values
// longer than max_value are errors. Bytes after `total` belong to the next reply.
GS_HD McReply mc_parse_get(const uint8_t *buf, size_t n, const char *key, size_t key_len, size_t max_value) {
  McReply r{kMcNeedMore, 0, 0, 0};
  if (n == 0) return r;
  if (buf[0] == 'E') {
    if (!detail::agrees(buf, n, "END\r\n", 5)) r.status = kMcError;
    else if (n >= 5) r = McReply{kMcMiss, 5, 0, 0};
    return r;
  }
  if (!detail::agrees(buf, n, "VALUE ", 6)) return McReply{kMcError, 0, 0, 0};
  // The header line must be complete before any field is judged.
  size_t eol = 0;
  for (size_t i = 0; i < n && i < kMcMaxLine; ++i)
    if (buf[i] == '\r') {
      eol = i;
      break;
    }
  if (eol == 0) return McReply{n >= kMcMaxLine ? kMcError : kMcNeedMore, 0, 0, 0};
  if (eol + 1 >= n) return r;  // the '\n' has not arrived
  if (buf[eol + 1] != '\n') return McReply{kMcError, 0, 0, 0};
  size_t pos = 6;
  if (eol < pos + key_len + 1 || !detail::agrees(buf + pos, key_len, key, key_len) || buf[pos + key_len] != ' ')
    return McReply{kMcError, 0, 0, 0};
  pos += key_len + 1;
  uint64_t flags = 0, bytes = 0, cas = 0;
  if (!detail::parse_decimal(buf, eol, &pos, 0xFFFFFFFFull, &flags) || pos >= eol || buf[pos++] != ' ' ||
      !detail::parse_decimal(buf, eol, &pos, max_value, &bytes))
    return McReply{kMcError, 0, 0, 0};
  if (pos < eol && (buf[pos++] != ' ' || !detail::parse_decimal(buf, eol, &pos, ~0ull >> 1, &cas) || pos != eol))
    return McReply{kMcError, 0, 0, 0};
  const size_t data = eol + 2, total = data + bytes + 7;  // data, "\r\n", "END\r\n"
  if (n < total) return McReply{kMcNeedMore, total, 0, 0};
  if (!detail::agrees(buf + data + bytes, 7, "\r\nEND\r\n", 7)) return McReply{kMcError, 0, 0, 0};
  return McReply{kMcHit, total, data, static_cast<size_t>(bytes)};
}

// Parses the reply to a set: "STORED\r\n".
GS_HD McReply mc_parse_stored(const uint8_t *buf, size_t n) {
  if (!detail::agrees(buf, n, "STORED\r\n", 8)) return McReply{kMcError, 0, 0, 0};
  if (n < 8) return McReply{kMcNeedMore, 0, 0, 0};
  return McReply{kMcStored, 8, 0, 0};
}

// What the answer to a request's get means: true when `value` is a reference
// to compare with; otherwise *reply is the answer (unknown identity, a record
// of another format). `status` is kMcHit or kMcMiss.
GS_HD bool reference_usable(McStatus status, const uint8_t *value, size_t len, const Features &f, uint64_t request_id,
                            Reply *reply) {
  if (status == kMcHit && record_matches(value, len, f)) return true;
  *reply =
      status == kMcMiss ? Reply{kUnknownIdentity, kReasonNone, request_id, 0, 0} : error_reply(request_id, kBadRecord);
  return false;
}

}  // namespace fv

#endif
