// How datapar reads the process environment: through an Environment, a function that
// looks a variable up, so that tests (and programs that configure a job some other way)
// can pass their own. Only public entry points read it (DeviceInventory::detect(),
// resolve_job_config() in rendezvous/job_config.h); nothing below them calls getenv.
// Every variable datapar reads is listed once in docs/launching.md, "Environment variables".
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace datapar {

// The value of the variable `name`, or nullopt when it is not set.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv). Not thread-safe against setenv, as getenv is not.
Environment process_environment();

}  // namespace datapar
