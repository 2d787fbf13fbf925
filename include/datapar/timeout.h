// The one default limit for every wait datapar makes on other processes: store operations,
// rendezvous, joining a process group, each collective, DDP's waits. Every option that
// takes a timeout defaults to it. Five minutes, not PyTorch's thirty: a job whose peer is
// gone should say so while someone still watches; stall warnings name a slow rank after
// kDefaultStallWarning (process_group.h). Raise it per call or per option where a rank may
// legitimately be busy longer between collectives (a long evaluation on one rank only).
#pragma once

#include <chrono>

namespace datapar {

constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(5);

}  // namespace datapar
