// What crosses a machine's network links, read from the kernel's counters: the bytes sent on
// every interface but loopback (/sys/class/net/*/statistics/tx_bytes). A bench whose ranks
// span machines (or network namespaces joined by a link, as bench/hsdp_link.sh makes them)
// counts with it the traffic between machines, which loopback does not carry.
#pragma once

#include <cstdint>

namespace datapar::tools {

// The bytes this machine (this network namespace) has sent on its links so far.
int64_t link_tx_bytes();

}  // namespace datapar::tools
