// NodeArena: recycles the small bookkeeping objects of a CachingPool (blocks, set and map nodes).
//
// Every locked allocation used to cost several malloc/free calls just for bookkeeping (a Block
// for the split tail, a std::set node, an unordered_map node); recycling them through per-size
// free lists makes the locked path cheaper than the allocator it replaces. Not thread-safe: the
// pool uses it only under its mutex. Memory is kept until the arena is destroyed, so it is bounded
// by the pool's peak number of blocks. Not installed.
#pragma once

#include <cstddef>
#include <new>
#include <utility>

namespace tandem::memory {

class NodeArena {
 public:
  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;
  ~NodeArena() {
    for (auto& list : lists_) {
      while (list.head != nullptr) {
        FreeNode* next = list.head->next;
        ::operator delete(list.head);
        list.head = next;
      }
    }
  }

  void* allocate(std::size_t bytes) {
    if (FreeList* list = find(bytes); list != nullptr && list->head != nullptr) {
      FreeNode* n = list->head;
      list->head = n->next;
      return n;
    }
    return ::operator new(bytes < sizeof(FreeNode) ? sizeof(FreeNode) : bytes);
  }

  void deallocate(void* p, std::size_t bytes) noexcept {
    FreeList* list = find(bytes);
    if (list == nullptr) {  // more distinct sizes than slots: not recycled
      ::operator delete(p);
      return;
    }
    auto* n = static_cast<FreeNode*>(p);
    n->next = list->head;
    list->head = n;
  }

  template <class T, class... Args>
  T* make(Args&&... args) {
    return new (allocate(sizeof(T))) T(std::forward<Args>(args)...);
  }

  template <class T>
  void destroy(T* p) noexcept {
    p->~T();
    deallocate(p, sizeof(T));
  }

 private:
  struct FreeNode {
    FreeNode* next;
  };
  struct FreeList {
    std::size_t size = 0;  // 0: slot unused
    FreeNode* head = nullptr;
  };

  // The slot for `bytes`, claiming an unused one; null when all are taken by other sizes.
  FreeList* find(std::size_t bytes) noexcept {
    for (auto& list : lists_) {
      if (list.size == bytes) return &list;
      if (list.size == 0) {
        list.size = bytes;
        return &list;
      }
    }
    return nullptr;
  }

  FreeList lists_[8];
};

// A std allocator over a NodeArena: single objects (container nodes) are recycled, arrays (hash
// buckets) go to the heap.
template <class T>
class ArenaAllocator {
 public:
  using value_type = T;

  explicit ArenaAllocator(NodeArena& arena) noexcept : arena_(&arena) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& other) noexcept : arena_(other.arena()) {}

  T* allocate(std::size_t n) {
    if (n == 1) return static_cast<T*>(arena_->allocate(sizeof(T)));
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1) arena_->deallocate(p, sizeof(T));
    else ::operator delete(p);
  }

  NodeArena* arena() const noexcept { return arena_; }

  template <class U>
  bool operator==(const ArenaAllocator<U>& other) const noexcept {
    return arena_ == other.arena();
  }
  template <class U>
  bool operator!=(const ArenaAllocator<U>& other) const noexcept {
    return arena_ != other.arena();
  }

 private:
  NodeArena* arena_;
};

}  // namespace tandem::memory
