#include "router/upstream.h"

#include <utility>  // std::exchange, used by Boost.Asio 1.74 headers under C++20
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <stdexcept>

namespace kvs::router {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;

HostPort parse_http_url(const std::string& url) {
  static const std::string kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) throw std::runtime_error("'" + url + "': expected http://HOST:PORT");
  std::string rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  // The router posts to the worker's own /v1/... paths: a prefix would be
  // dropped without a word, so it is refused.
  if (rest.find_first_of("/?#") != std::string::npos)
    throw std::runtime_error("'" + url + "': a worker URL has no path (the router sends /v1/... to the worker "
                             "itself); expected http://HOST:PORT");
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) throw std::runtime_error("'" + url + "': expected http://HOST:PORT");
  HostPort hp;
  hp.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  hp.port = 0;
  if (!port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos)
    hp.port = std::stoi(port);
  if (hp.port < 1 || hp.port > 65535) throw std::runtime_error("'" + url + "': the port must be 1..65535");
  return hp;
}

std::optional<SimpleReply> http_get(const HostPort& to, const std::string& target, double timeout_s,
                                    std::string* error) {
  // Asynchronous steps on a private io_context: the stream's one deadline
  // bounds them all (synchronous Asio calls would ignore it).
  net::io_context ioc;
  beast::tcp_stream s(ioc);
  s.expires_after(std::chrono::milliseconds(int64_t(timeout_s * 1000)));
  beast::error_code ec;
  net::ip::tcp::resolver res(ioc);
  const auto eps = res.resolve(to.host, std::to_string(to.port), ec);
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, to.host);
  req.set(http::field::connection, "close");
  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(4u << 20);
  auto done = [&ec](beast::error_code e, auto&&...) { ec = e; };
  if (!ec) {
    s.async_connect(eps, done);
    ioc.run();
  }
  if (!ec) {
    http::async_write(s, req, done);
    ioc.restart();
    ioc.run();
  }
  if (!ec) {
    http::async_read(s, buf, p, done);
    ioc.restart();
    ioc.run();
  }
  if (ec) {
    if (error) *error = ec.message();
    return std::nullopt;
  }
  s.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  return SimpleReply{int(p.get().result_int()), std::move(p.get().body())};
}

}  // namespace kvs::router
