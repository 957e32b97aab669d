// Which committed command buffers synchronize() waits for, kept apart from the
// Objective-C++ so that Linux tests run it with stand-in command buffers
// (tests/test_objc_gate.py).
//
// The invariant it keeps (the Metal side of csrc/backend/backend.h's synchronize contract):
//   when wait_committed() returns, every command buffer committed before the call began,
//   by this thread or any other, has completed; and the storages a command buffer uses are
//   released only after that command buffer has completed.
// Each caller waits on its own snapshot of the committed list and only completed entries
// are removed, so a thread can never return early because another thread took its command
// buffer into a private batch that is still running.
#pragma once
#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fm::metal {

template <typename CommandBuffer, typename Keep>
class CommandTracker {
 public:
  // A command buffer was committed; `keep` (the storages it uses) lives until it completed.
  void committed(CommandBuffer cb, std::vector<Keep> keep) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(Entry{std::move(cb), std::move(keep)});
  }

  bool empty() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.empty();
  }

  // Releases (outside the lock) what has completed, without waiting: called at each commit
  // so that a loop that never waits still returns its blocks to the pool. A failure found
  // here is reported by the next wait_committed().
  template <typename Finished, typename Failure>
  void reap(Finished finished, Failure failure) {
    std::vector<Entry> done;  // destroyed after the lock is released
    std::lock_guard<std::mutex> lock(mu_);
    retire_finished(finished, done, [&](const Entry& e) {
      if (unreported_error_.empty()) unreported_error_ = failure(e.cb);
    });
  }

  // Blocks until everything committed before this call completed, then releases what has
  // completed (outside the lock). wait(cb) blocks until cb completed; finished(cb) says
  // whether it has; failure(cb) is its error ("" if none). Returns the first failure of
  // the waited command buffers, or one that an earlier call retired without waiting on it.
  template <typename Wait, typename Finished, typename Failure>
  std::string wait_committed(Wait wait, Finished finished, Failure failure) {
    std::vector<CommandBuffer> mine;
    std::string error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Entry& e : entries_) mine.push_back(e.cb);
      error.swap(unreported_error_);
    }
    for (const CommandBuffer& cb : mine) {
      wait(cb);
      if (error.empty()) error = failure(cb);
    }
    std::vector<Entry> done;  // destroyed after the lock is released
    {
      std::lock_guard<std::mutex> lock(mu_);
      retire_finished(finished, done, [&](const Entry& e) {
        // A failure nobody waited on yet is reported by the next call.
        const bool waited = std::find(mine.begin(), mine.end(), e.cb) != mine.end();
        if (!waited && unreported_error_.empty()) unreported_error_ = failure(e.cb);
      });
    }
    return error;
  }

 private:
  struct Entry {
    CommandBuffer cb;
    std::vector<Keep> keep;
  };
  // With mu_ held: moves the completed entries into `done` (the caller destroys them after
  // unlocking, since releasing a storage may take the GIL), calling retired(entry) on each.
  template <typename Finished, typename Retired>
  void retire_finished(Finished finished, std::vector<Entry>& done, Retired retired) {
    std::vector<Entry> running;
    for (Entry& e : entries_) {
      if (!finished(e.cb)) {
        running.push_back(std::move(e));
        continue;
      }
      retired(e);
      done.push_back(std::move(e));
    }
    entries_.swap(running);
  }

  std::mutex mu_;
  std::vector<Entry> entries_;
  std::string unreported_error_;
};

}  // namespace fm::metal
