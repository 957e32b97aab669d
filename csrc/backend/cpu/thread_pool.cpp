#include "thread_pool.h"
#include "cpu_env.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

#if defined(__linux__)
#include <sched.h>
#endif

namespace fm::cpu {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

struct ThreadPool::Job {
  const std::function<void(std::int64_t)>* fn;
  std::int64_t n;
  std::atomic<std::int64_t> next{0};
  std::atomic<std::int64_t> done{0};
  std::mutex mu;
  std::condition_variable finished;
  std::exception_ptr error;
  // Workers currently inside run_some: raised under the pool's mutex (so a worker never
  // enters a job its caller has already retired), lowered without it.
  std::atomic<int> workers_inside{0};
};

int default_num_threads() {
  if (const int n = env_num_threads()) return n;  // 0: unset or not understood (reported)
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& ThreadPool::instance() {
  // Leaked on purpose: workers must not be joined during static destruction at exit.
  static ThreadPool* pool = new ThreadPool(default_num_threads());
  return *pool;
}

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stop_flag_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

// Claims and runs indices of `job` until none are left. Returns true if this call ran the
// job's last index.
bool ThreadPool::run_some(Job& job) {
  bool last = false;
  for (;;) {
    const std::int64_t i = job.next.fetch_add(1);
    if (i >= job.n) break;
    try {
      (*job.fn)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(job.mu);
      if (!job.error) job.error = std::current_exception();
    }
    if (job.done.fetch_add(1) + 1 == job.n) last = true;
  }
  if (last) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.finished.notify_all();
  }
  return last;
}

void ThreadPool::worker_loop() {
  for (;;) {
    // Spin a little before sleeping: ops in a loop submit work again within microseconds,
    // and waking a sleeping thread costs tens of microseconds.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    bool saw_work = false;
    while (!(saw_work = queued_.load(std::memory_order_acquire) != 0) && !stop_flag_.load() &&
           std::chrono::steady_clock::now() < spin_until) {
      for (int i = 0; i < 16; ++i) cpu_relax();
    }
    Job* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Work came, but its caller ran it all and retired it before this thread got the
      // lock: spin again rather than sleep. Sleeping here would make every later launch
      // wake this thread too late to help (a futex wake-up costs more than a small
      // launch), so the caller would run them all alone (sigmoid of 2^16 floats on 2
      // threads took longer than on one).
      if (saw_work && queue_.empty() && !stop_) continue;
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = queue_.front();
      if (job->next.load() >= job->n) {  // fully claimed: no more work here
        queue_.pop_front();
        queued_.fetch_sub(1);
        continue;
      }
      job->workers_inside.fetch_add(1);
    }
    run_some(*job);
    job->workers_inside.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(&job);
    queued_.fetch_add(1);
  }
  cv_.notify_all();
  run_some(job);
  // Short jobs finish within microseconds of each other: spin a little before sleeping,
  // since a futex wake-up costs more than the work of a small launch.
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
  while (job.done.load(std::memory_order_acquire) != job.n &&
         std::chrono::steady_clock::now() < spin_until)
    cpu_relax();
  if (job.done.load() != job.n) {
    std::unique_lock<std::mutex> lock(job.mu);
    job.finished.wait(lock, [&] { return job.done.load() == job.n; });
  }
  {
    // The job lives on this stack frame: no worker may still see it or be inside it.
    std::unique_lock<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it)
      if (*it == &job) {
        queue_.erase(it);
        queued_.fetch_sub(1);
        break;
      }
  }
  // A worker that ran the last index may still be leaving run_some.
  while (job.workers_inside.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace fm::cpu
