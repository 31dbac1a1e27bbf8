#include "router/relay_watch.h"

#include <cerrno>
#include <sys/socket.h>

namespace kvs::router {

void poll_every(boost::asio::steady_timer& t, std::chrono::milliseconds period, const bool& ended,
                std::function<bool()> check) {
  if (ended) return;
  t.expires_after(period);
  t.async_wait([&t, period, &ended, check = std::move(check)](boost::system::error_code ec) mutable {
    if (ec || ended || check()) return;
    poll_every(t, period, ended, std::move(check));
  });
}

void watch_hangup(boost::asio::ip::tcp::socket& sock, const bool& ended, std::function<void()> on_hangup) {
  if (ended) return;
  sock.async_wait(boost::asio::ip::tcp::socket::wait_read,
                  [&sock, &ended, on_hangup = std::move(on_hangup)](boost::system::error_code ec) mutable {
                    if (ec || ended) return;
                    char c;
                    const ssize_t n = ::recv(sock.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
                    if (n > 0) return;
                    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                      return watch_hangup(sock, ended, std::move(on_hangup));
                    on_hangup();
                  });
}

}  // namespace kvs::router
