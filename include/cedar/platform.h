// cedar's public API for front ends (tools/): the process-wide services a command sets up or
// reads: the compute thread pool (ThreadPool::set_default_threads), logging (CEDAR_LOG_*), the
// wall clock of progress lines (Timer) and whole-file reads (read_whole_file).
#pragma once

#include "core/file.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
