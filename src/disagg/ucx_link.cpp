#include "disagg/ucx_link.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace kvs::disagg {

namespace {
// Every kvserve message uses this one active-message id; the header's first
// byte says what it is (wire.h).
constexpr unsigned kAmId = 0x4b;
constexpr const char* kSegmentSize = "2m";

std::runtime_error ucx_error(const std::string& what, ucs_status_t s) {
  return std::runtime_error("ucx: " + what + ": " + ucs_status_string(s));
}

sockaddr_storage resolve(const std::string& host, uint16_t port, socklen_t& len) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string h = host.empty() ? "0.0.0.0" : host;
  if (getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw std::runtime_error("ucx: cannot resolve address " + h);
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  return ss;
}

struct SendOp {
  std::vector<uint8_t> header;
  std::function<void(bool)> done;
};
struct RecvOp {
  std::function<void(bool)> done;
};
}  // namespace

struct UcxLink::Impl {
  Handlers h;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  int post_fd = -1, worker_fd = -1;
  std::mutex mu;
  std::vector<std::function<void()>> tasks;
  std::atomic<bool> stop{false};
  bool closing = false;  // progress thread: tearing down, no more handlers
  std::thread th;
  std::unordered_map<ConnId, ucp_ep_h> eps;
  std::unordered_map<ucp_ep_h, ConnId> ids;
  std::atomic<ConnId> next{1};

  void wake() {
    const uint64_t one = 1;
    (void)!::write(post_fd, &one, sizeof one);
  }
  void run();
  void teardown();
  ucp_ep_h make_ep(ConnId id, ucp_ep_params_t& p);
  void drop(ConnId id, bool notify, const std::string& why);
  void close_pending();
  std::vector<void*> releases;  // assembled messages to give back to UCX
  std::vector<ucp_ep_h> to_close;
  std::vector<void*> close_reqs;

  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void on_conn(ucp_conn_request_h req, void* arg);
  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param);
};

ucp_ep_h UcxLink::Impl::make_ep(ConnId id, ucp_ep_params_t& p) {
  p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &Impl::on_error;
  p.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t s = ucp_ep_create(worker, &p, &ep);
  if (s != UCS_OK) return nullptr;
  eps[id] = ep;
  ids[ep] = id;
  return ep;
}

// Endpoints are closed from the loop, never inside a UCX callback (which
// must not re-enter the worker).
void UcxLink::Impl::close_pending() {
  for (ucp_ep_h ep : to_close) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) close_reqs.push_back(r);
  }
  to_close.clear();
  std::erase_if(close_reqs, [](void* r) {
    if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
    ucp_request_free(r);
    return true;
  });
}

void UcxLink::Impl::drop(ConnId id, bool notify, const std::string& why) {
  auto it = eps.find(id);
  if (it == eps.end()) return;
  ucp_ep_h ep = it->second;
  eps.erase(it);
  ids.erase(ep);
  to_close.push_back(ep);
  if (notify && !closing && h.on_disconnect) h.on_disconnect(id, why);
}

void UcxLink::Impl::on_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Impl*>(arg);
  auto it = self->ids.find(ep);
  if (it == self->ids.end()) return;
  self->drop(it->second, true, std::string("connection lost: ") + ucs_status_string(status));
}

void UcxLink::Impl::on_conn(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  if (self->closing) {
    ucp_listener_reject(self->listener, req);
    return;
  }
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = req;
  const ConnId id = self->next++;
  if (self->make_ep(id, p) && self->h.on_accept) self->h.on_accept(id);
}

ucs_status_t UcxLink::Impl::on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                  const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ConnId id = 0;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    auto it = self->ids.find(param->reply_ep);
    if (it != self->ids.end()) id = it->second;
  }
  Incoming in{data, length, rndv, rndv ? data : nullptr, false};
  if (id != 0 && !self->closing && self->h.on_message)
    self->h.on_message(id, {static_cast<const uint8_t*>(header), header_length}, in);
  if (rndv && !in.taken) {
    // Unwanted rendezvous data is given back from the loop, outside the
    // callback (released inside it, UCX keeps one buffer until teardown).
    self->releases.push_back(data);
    return UCS_INPROGRESS;
  }
  return UCS_OK;
}

void UcxLink::Impl::run() {
  auto last_tick = std::chrono::steady_clock::now();
  while (!stop.load()) {
    while (ucp_worker_progress(worker) != 0) {
    }
    std::vector<std::function<void()>> now;
    {
      std::lock_guard lk(mu);
      now.swap(tasks);
    }
    for (auto& f : now) f();
    for (void* d : releases) ucp_am_data_release(worker, d);
    releases.clear();
    close_pending();
    if (!now.empty()) continue;
    const auto t = std::chrono::steady_clock::now();
    if (t - last_tick >= std::chrono::milliseconds(50)) {
      last_tick = t;
      if (h.on_tick) h.on_tick();
    }
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{worker_fd, POLLIN, 0}, {post_fd, POLLIN, 0}};
    ::poll(fds, 2, 50);
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(post_fd, &v, sizeof v);
    }
  }
  teardown();
}

void UcxLink::Impl::teardown() {
  closing = true;
  for (void* d : releases) ucp_am_data_release(worker, d);
  releases.clear();
  while (!eps.empty()) drop(eps.begin()->first, false, {});
  close_pending();
  // Bounded: forced closes complete locally.
  for (int i = 0; i < 100000 && !close_reqs.empty(); ++i) {
    ucp_worker_progress(worker);
    close_pending();
  }
  if (listener) ucp_listener_destroy(listener);
  listener = nullptr;
}

// An offer carries the prompt's token ids and chain keys in its active-
// message header, and UCX sends a header in one transport segment (also the
// rendezvous request): with the default segment a long prompt's offer does
// not fit and UCX aborts the process. Segments large enough for the longest
// context are asked for, unless the user set them. UCX 1.13 reads transport
// settings only from the environment (ucp_config_modify does not reach them),
// so this must run before any thread that reads the environment: `serve`
// calls it at start; the link's constructor calls it again for other users.
void widen_ucx_segments() {
  for (const char* name : {"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "UCX_MM_SEG_SIZE"})
    ::setenv(name, kSegmentSize, 0);
}

UcxLink::UcxLink(Handlers h) : impl_(std::make_unique<Impl>()) {
  widen_ucx_segments();
  Impl& m = *impl_;
  m.h = std::move(h);
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK) throw ucx_error("reading the configuration", s);
  ucp_params_t cp{};
  cp.field_mask = UCP_PARAM_FIELD_FEATURES;
  cp.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  s = ucp_init(&cp, cfg, &m.ctx);
  ucp_config_release(cfg);
  if (s != UCS_OK) throw ucx_error("init", s);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(m.ctx, &wp, &m.worker);
  if (s == UCS_OK) s = ucp_worker_get_efd(m.worker, &m.worker_fd);
  if (s == UCS_OK) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = kAmId;
    hp.cb = &Impl::on_am;
    hp.arg = &m;
    s = ucp_worker_set_am_recv_handler(m.worker, &hp);
  }
  m.post_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s != UCS_OK || m.post_fd < 0) {
    if (m.worker) ucp_worker_destroy(m.worker);
    ucp_cleanup(m.ctx);
    if (m.post_fd >= 0) ::close(m.post_fd);
    throw ucx_error("worker", s == UCS_OK ? UCS_ERR_IO_ERROR : s);
  }
  m.th = std::thread([&m] { m.run(); });
}

UcxLink::~UcxLink() {
  Impl& m = *impl_;
  m.stop = true;
  m.wake();
  m.th.join();
  ucp_worker_destroy(m.worker);
  ucp_cleanup(m.ctx);
  ::close(m.post_fd);
}

void UcxLink::post(std::function<void()> f) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->tasks.push_back(std::move(f));
  }
  impl_->wake();
}

uint16_t UcxLink::listen(const std::string& host, uint16_t port) {
  socklen_t len = 0;
  const sockaddr_storage sa = resolve(host, port, len);
  std::promise<uint16_t> got;
  auto fut = got.get_future();
  post([this, sa, len, &got] {
    Impl& m = *impl_;
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = len;
    lp.conn_handler.cb = &Impl::on_conn;
    lp.conn_handler.arg = &m;
    ucs_status_t s = ucp_listener_create(m.worker, &lp, &m.listener);
    ucp_listener_attr_t a{};
    a.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (s == UCS_OK) s = ucp_listener_query(m.listener, &a);
    if (s != UCS_OK) {
      got.set_exception(std::make_exception_ptr(ucx_error("listening", s)));
      return;
    }
    got.set_value(ntohs(reinterpret_cast<const sockaddr_in*>(&a.sockaddr)->sin_port));
  });
  try {
    return fut.get();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + " on " + host + ":" + std::to_string(port));
  }
}

ConnId UcxLink::connect(const std::string& host, uint16_t port) {
  socklen_t len = 0;
  const sockaddr_storage sa = resolve(host, port, len);
  const ConnId id = impl_->next++;
  post([this, id, sa, len] {
    Impl& m = *impl_;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    p.sockaddr.addrlen = len;
    if (!m.make_ep(id, p) && m.h.on_disconnect) m.h.on_disconnect(id, "cannot create a UCX endpoint");
  });
  return id;
}

void UcxLink::send(ConnId c, std::vector<uint8_t> header, std::span<const uint8_t> payload,
                   std::function<void(bool)> done) {
  // Shared, so that a task dropped unrun (the link closing first) frees it;
  // a request in flight holds its own reference until its callback.
  auto op = std::make_shared<SendOp>(SendOp{std::move(header), std::move(done)});
  post([this, c, op, payload] {
    Impl& m = *impl_;
    auto finish = [&op](bool ok) {
      if (op->done) op->done(ok);
    };
    auto it = m.eps.find(c);
    if (it == m.eps.end()) return finish(false);
    auto* held = new std::shared_ptr<SendOp>(op);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    p.user_data = held;
    p.cb.send = [](void* req, ucs_status_t s, void* user) {
      auto* h = static_cast<std::shared_ptr<SendOp>*>(user);
      if ((*h)->done) (*h)->done(s == UCS_OK);
      delete h;
      ucp_request_free(req);
    };
    ucs_status_ptr_t r = ucp_am_send_nbx(it->second, kAmId, op->header.data(), op->header.size(), payload.data(),
                                         payload.size(), &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) return;  // the callback finishes it
    delete held;
    finish(r == nullptr);
  });
}

void UcxLink::recv_data(Incoming& data, std::span<uint8_t> dst, std::function<void(bool)> done) {
  data.taken = true;
  if (dst.size() != data.length) {
    if (data.rndv) ucp_am_data_release(impl_->worker, data.desc);
    return done(false);
  }
  if (!data.rndv) {
    if (data.length) std::memcpy(dst.data(), data.data, data.length);
    return done(true);
  }
  auto* op = new RecvOp{std::move(done)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = op;
  p.cb.recv_am = [](void* req, ucs_status_t s, size_t, void* user) {
    auto* o = static_cast<RecvOp*>(user);
    o->done(s == UCS_OK);
    delete o;
    ucp_request_free(req);
  };
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(impl_->worker, data.desc, dst.data(), dst.size(), &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    op->done(r == nullptr);
    delete op;
  }
}

void UcxLink::close(ConnId c) {
  post([this, c] { impl_->drop(c, false, {}); });
}

}  // namespace kvs::disagg
