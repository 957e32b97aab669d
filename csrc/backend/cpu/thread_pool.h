// A fixed pool of worker threads for the CPU backend. Size: FASTMETAL_NUM_THREADS, else
// the number of cores this process may run on. Several Python threads may submit work at
// once; each caller also works on its own job, so a full pool never deadlocks.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fm::cpu {

class ThreadPool {
 public:
  static ThreadPool& instance();
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  int num_threads() const { return int(workers_.size()) + 1; }
  // Calls fn(i) for i in [0, n), spread over the pool; returns when all are done.
  // The first exception thrown by fn is re-thrown here.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn);

 private:
  struct Job;
  void worker_loop();
  static bool run_some(Job& job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> queue_;
  bool stop_ = false;
  std::atomic<bool> stop_flag_{false};  // stop_, readable without the mutex
  std::atomic<int> queued_{0};           // jobs in queue_, readable without the mutex
};

int default_num_threads();

}  // namespace fm::cpu
