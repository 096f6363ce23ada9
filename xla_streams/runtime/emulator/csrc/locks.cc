// libxsim_locks: which mutexes each host thread holds, for the stand-in NCCL's
// lockset check ([threads] in nccl.cc: every NCCL call on a communicator must
// hold a lock that every other thread calling on it holds too).
//
// It defines pthread's mutex functions ahead of libc's (a dependency of
// xsim-replay listed before libc, or LD_PRELOAD in another process), records
// each mutex a thread acquires and releases, and calls libc's own. A condition
// variable's wait releases its mutex and takes it again. Built without symbol
// versions, so that its definitions stand for libc's versioned ones.
#include <dlfcn.h>
#include <pthread.h>

#include <cstring>

namespace {

constexpr int kMaxHeld = 64;
thread_local void* t_held[kMaxHeld];
thread_local int t_count = 0;

void Acquired(void* m) {
  if (t_count < kMaxHeld) t_held[t_count++] = m;
}

void Released(void* m) {
  for (int i = t_count - 1; i >= 0; --i) {
    if (t_held[i] == m) {
      std::memmove(&t_held[i], &t_held[i + 1], sizeof(void*) * (t_count - i - 1));
      --t_count;
      return;
    }
  }
}

template <typename F>
F Next(const char* name, const char* version = nullptr) {
  void* f = version ? dlvsym(RTLD_NEXT, name, version) : dlsym(RTLD_NEXT, name);
  return reinterpret_cast<F>(f);
}

}  // namespace

extern "C" {

int pthread_mutex_lock(pthread_mutex_t* m) {
  static auto next = Next<int (*)(pthread_mutex_t*)>("pthread_mutex_lock");
  int r = next(m);
  if (r == 0) Acquired(m);
  return r;
}

int pthread_mutex_trylock(pthread_mutex_t* m) {
  static auto next = Next<int (*)(pthread_mutex_t*)>("pthread_mutex_trylock");
  int r = next(m);
  if (r == 0) Acquired(m);
  return r;
}

int pthread_mutex_unlock(pthread_mutex_t* m) {
  static auto next = Next<int (*)(pthread_mutex_t*)>("pthread_mutex_unlock");
  Released(m);
  return next(m);
}

int pthread_cond_wait(pthread_cond_t* c, pthread_mutex_t* m) {
  static auto next =
      Next<int (*)(pthread_cond_t*, pthread_mutex_t*)>("pthread_cond_wait", "GLIBC_2.3.2");
  Released(m);
  int r = next(c, m);
  Acquired(m);
  return r;
}

int pthread_cond_timedwait(pthread_cond_t* c, pthread_mutex_t* m, const struct timespec* t) {
  static auto next = Next<int (*)(pthread_cond_t*, pthread_mutex_t*, const struct timespec*)>(
      "pthread_cond_timedwait", "GLIBC_2.3.2");
  Released(m);
  int r = next(c, m, t);
  Acquired(m);
  return r;
}

int pthread_cond_clockwait(pthread_cond_t* c, pthread_mutex_t* m, clockid_t clock,
                           const struct timespec* t) {
  static auto next =
      Next<int (*)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const struct timespec*)>(
          "pthread_cond_clockwait");
  Released(m);
  int r = next(c, m, clock, t);
  Acquired(m);
  return r;
}

// The mutexes this thread holds now: copied into `out`; returns how many, or -1
// when this library's pthread functions are not the ones the process calls (it was
// loaded after libc, not preloaded), so that it sees no lock.
int xsim_locks_held(void** out, int capacity) {
  static const bool interposed = [] {
    static pthread_mutex_t probe = PTHREAD_MUTEX_INITIALIZER;
    int before = t_count;
    pthread_mutex_lock(&probe);  // resolved as every caller's call is
    bool seen = t_count > before;
    pthread_mutex_unlock(&probe);
    return seen;
  }();
  if (!interposed) return -1;
  int n = t_count < capacity ? t_count : capacity;
  std::memcpy(out, t_held, sizeof(void*) * n);
  return n;
}

}  // extern "C"
