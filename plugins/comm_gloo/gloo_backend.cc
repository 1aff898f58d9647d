#include "plugins/comm_gloo/gloo_backend.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "plugins/comm_gloo/failure.h"
#include "plugins/comm_gloo/gloo_communicator.h"
#include "plugins/comm_gloo/store_adapter.h"

namespace loom::comm_gloo {
namespace {

// How long create_communicator waits for the other ranks of the group (the communicator's
// own timeout is set later by the core through set_timeout_ms).
constexpr std::chrono::milliseconds kConnectTimeout{300000};

bool loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
  }
  return true;
}

// This machine's hostname when it resolves to an address other ranks can reach; else
// 127.0.0.1 (a single machine whose name maps to loopback, as many containers do).
std::string default_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &found) != 0) return "127.0.0.1";
  bool reachable = false;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next)
    if (a->ai_addr != nullptr && !loopback(a->ai_addr)) reachable = true;
  freeaddrinfo(found);
  return reachable ? name : "127.0.0.1";
}

std::string describe(const std::string& key, int32_t rank, int32_t size) {
  return "create_communicator for group '" + key + "' (rank " + std::to_string(rank) + " of " +
         std::to_string(size) + ")";
}

// The text gloo's errors name each peer by: the address that peer published for its pair
// with this rank (rendezvous::Context stores, under key "<rank>", one address per other
// rank, in rank order, skipping itself).
std::vector<std::string> peer_addresses(StoreAdapter& store, int32_t rank, int32_t size) {
  std::vector<std::string> addresses(size);
  for (int32_t peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    std::vector<char> all = store.get(std::to_string(peer));
    const size_t each = all.size() / static_cast<size_t>(size - 1);
    const size_t index = static_cast<size_t>(rank > peer ? rank - 1 : rank);
    if (each == 0 || all.size() % (size - 1) != 0) continue;  // unknown layout: no names
    std::vector<char> bytes(all.begin() + index * each, all.begin() + (index + 1) * each);
    addresses[peer] = gloo::transport::tcp::Address(bytes).str();
  }
  return addresses;
}

}  // namespace

GlooBackend::GlooBackend(const nlohmann::json& options, IBuildContext&) {
  hostname_ = options.value("hostname", "");
  interface_ = options.value("interface", "");
  if (!hostname_.empty() && !interface_.empty())
    fail(Code::kInvalidArgument, "/interface: set either hostname ('" + hostname_ +
                                     "') or interface ('" + interface_ + "'), not both");
}

std::shared_ptr<gloo::transport::Device> GlooBackend::device() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (device_) return device_;
  // Checked here: gloo's own lookup of a missing interface throws without freeing what it
  // allocated, and says less.
  if (!interface_.empty() && if_nametoindex(interface_.c_str()) == 0)
    fail(Code::kUnavailable, "comm_backend 'gloo': there is no network interface '" + interface_ +
                                 "' on this machine; set the backend's \"interface\" to one of "
                                 "its interfaces (ip link) or set \"hostname\" instead");
  gloo::transport::tcp::attr attr;
  if (!interface_.empty())
    attr.iface = interface_;
  else
    attr.hostname = hostname_.empty() ? default_hostname() : hostname_;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    const std::string where =
        interface_.empty() ? "hostname '" + attr.hostname + "'" : "interface '" + interface_ + "'";
    fail(Code::kUnavailable,
         "comm_backend 'gloo': cannot listen on " + where + " (" + e.what() +
             "); set the backend's \"hostname\" to an address of this machine or "
             "\"interface\" to one of its network interfaces");
  }
  return device_;
}

Status GlooBackend::create_communicator(IRendezvousStore* store, StringView group_key, int32_t rank,
                                        int32_t size, DeviceType device_type,
                                        ICommunicator** out) noexcept {
  return guard([&] {
    const std::string key(group_key.data != nullptr ? group_key.data : "", group_key.size);
    const std::string what = describe(key, rank, size);
    if (out == nullptr) fail(Code::kInvalidArgument, what + ": out is null");
    *out = nullptr;
    if (device_type != DeviceType::kCpu)
      fail(Code::kUnimplemented,
           what +
               ": comm_backend 'gloo' moves CPU tensors only; CUDA tensors go over "
               "comm_nccl");
    if (size < 1 || rank < 0 || rank >= size)
      fail(Code::kInvalidArgument, what + ": rank must be in [0, size) and size >= 1");
    if (size == 1) {  // nothing to connect: every operation is local
      *out = new GlooCommunicator(key, 0, 1, nullptr, {});
      return;
    }
    if (store == nullptr) fail(Code::kInvalidArgument, what + ": the rendezvous store is null");
    if (key.empty()) fail(Code::kInvalidArgument, what + ": the group key is empty");
    std::shared_ptr<gloo::transport::Device> dev = device();
    StoreAdapter adapter(store, key, kConnectTimeout);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(kConnectTimeout);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> addresses;
    try {
      context->connectFullMesh(adapter, dev);
      addresses = peer_addresses(adapter, rank, size);
    } catch (const Error& e) {
      if (e.code() == Code::kDeadlineExceeded)
        fail(e.code(), what + ": timed out after 300 s waiting for the other ranks to join (" +
                           e.what() +
                           "); a rank did not start, crashed, or uses another rendezvous");
      fail(e.code(), what + ": " + e.what());
    } catch (...) {
      FailureContext failure_context;
      failure_context.what = what;
      failure_context.timeout_ms = kConnectTimeout.count();
      failure_context.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - start)
                                       .count();
      Failure failure = classify_failure(std::current_exception(), failure_context);
      fail(failure.code, failure.message);
    }
    *out = new GlooCommunicator(key, rank, size, std::move(context), std::move(addresses));
  });
}

}  // namespace loom::comm_gloo
