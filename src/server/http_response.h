// HTTP/1.1 responses as bytes, for the servers here that write their own
// (`kvserve serve`'s sessions and `kvserve router`'s front): the status
// line, a whole response with Content-Length, and the head of a streamed
// (SSE) response.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvs::server {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra (Retry-After, ...)
};

// "HTTP/1.1 <status> <reason>\r\n".
std::string status_line(int status);
// A complete response; `server` is the Server header's value.
std::string full_response(const HttpResponse& r, std::string_view server, bool keep_alive);
// The head of a streamed response: no caching, no proxy buffering; the
// body chunked, or (chunked == false: an HTTP/1.0 client, or a stream that
// ends with the connection) delimited by the connection's close.
std::string stream_head(int status, std::string_view server, std::string_view content_type, bool chunked,
                        bool keep_alive);

}  // namespace kvs::server
