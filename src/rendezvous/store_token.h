// The store token: how it is made, compared, and shared between the processes of one
// machine when nobody gave one.
//
// A TcpStore never runs without a token (Note [Token]):
//   - given (TcpStoreOptions::token; rendezvous() passes DATAPAR_STORE_TOKEN, which datapar
//     launch sets):
//     every process presents it;
//   - not given: the server makes a random one and publishes it in a file only this user
//     can read, /tmp/datapar-UID/store-PORT.token, in a directory only this user can enter,
//     before it starts listening; a client of this machine given none reads it from there
//     once it has connected (so the file is the server's). A client on another machine
//     cannot, and is refused at once with a message saying how to give a token.
// So torchrun, mpirun or srun jobs on one machine work without setting anything, and a job
// across machines needs DATAPAR_STORE_TOKEN (or datapar launch --token-file) on every node.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace datapar::detail {

// 32 hex digits from the kernel's random source.
std::string random_token();

// The file where the server of `port` on this machine publishes a generated token.
std::string local_token_path(uint16_t port);

// Writes `token` to local_token_path(port) (mode 0600, atomically). Throws
// InvalidArgumentError if the directory is not private to this user.
void publish_local_token(uint16_t port, const std::string& token);

// Removes the file, if it still holds `token` (a later server may have replaced it).
void remove_local_token(uint16_t port, const std::string& token);

// The token published for `port`, or nullopt when there is none (or it is not private).
std::optional<std::string> read_local_token(uint16_t port);

// Whether host names an address of this machine (one it can bind to).
bool is_local_address(const std::string& host);

}  // namespace datapar::detail
