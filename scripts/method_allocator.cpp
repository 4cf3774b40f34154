// Loads a .pte's "forward" with ExecuTorch's own runtime (libexecutorch.so) and prints the bytes its
// method allocator handed out. Kernels are registered as stubs (loading resolves them, never runs them).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

using namespace executorch::runtime;

static void stub(KernelRuntimeContext&, Span<EValue*>) {}

int main(int argc, char** argv) {
  runtime_init();
  std::ifstream file(argv[1], std::ios::binary);
  std::vector<char> data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> names(argv + 2, argv + argc);
  std::vector<Kernel> kernels;
  for (auto& name : names) kernels.emplace_back(name.c_str(), stub);
  if (register_kernels({kernels.data(), kernels.size()}) != Error::Ok) { std::puts("register failed"); return 2; }
  executorch::extension::BufferDataLoader loader(data.data(), data.size());
  auto program = Program::load(&loader, Program::Verification::Minimal);
  if (!program.ok()) { std::printf("load failed %d\n", (int)program.error()); return 2; }
  auto meta = program->method_meta("forward");
  std::vector<std::vector<uint8_t>> planned;
  std::vector<Span<uint8_t>> spans;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    planned.emplace_back(meta->memory_planned_buffer_size(i).get());
  }
  for (auto& b : planned) spans.emplace_back(b.data(), b.size());
  HierarchicalAllocator planned_memory({spans.data(), spans.size()});
  static uint8_t pool[64 << 20];
  MemoryAllocator method_allocator(sizeof(pool), pool);
  static uint8_t scratch[64 << 20];
  MemoryAllocator temp_allocator(sizeof(scratch), scratch);
  MemoryManager memory(&method_allocator, &planned_memory, &temp_allocator);
  auto method = program->load_method("forward", &memory);
  if (!method.ok()) { std::printf("load_method failed %d\n", (int)method.error()); return 2; }
  std::printf("method_allocator_bytes=%zu\n", method_allocator.used_size());
  return 0;
}
