// The demo corpus, embedded with the assembler's .incbin: LONGHAUL_CORPUS_FILE is the
// concatenation of worker/data/corpus/*.txt that CMake assembles at build time.
#include "longhaul/data/prepare.h"

#ifndef LONGHAUL_CORPUS_FILE
#error "LONGHAUL_CORPUS_FILE must name the concatenated corpus (set by worker/data/CMakeLists.txt)"
#endif

#define LONGHAUL_STR2(x) #x
#define LONGHAUL_STR(x) LONGHAUL_STR2(x)

asm(".section .rodata\n"
    ".balign 16\n"
    ".global longhaul_corpus_begin\n"
    "longhaul_corpus_begin:\n"
    ".incbin \"" LONGHAUL_STR(LONGHAUL_CORPUS_FILE) "\"\n"
    ".global longhaul_corpus_end\n"
    "longhaul_corpus_end:\n"
    ".byte 0\n"
    ".previous\n");

extern "C" const char longhaul_corpus_begin[];
extern "C" const char longhaul_corpus_end[];

namespace longhaul::data {

std::string_view embedded_corpus() {
  return {longhaul_corpus_begin, static_cast<size_t>(longhaul_corpus_end - longhaul_corpus_begin)};
}

}  // namespace longhaul::data
