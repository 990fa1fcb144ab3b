/* version.h: what this binary was built from and with (./train --version). */
#ifndef VERSION_H
#define VERSION_H
#include <stdio.h>

/* Prints the source's git describe, the CUDA runtime linked in and the
 * driver found, the GPU architectures compiled, and NCCL's version at build
 * time and at run time (and which library was loaded); "not compiled in"
 * for what the build left out. Never fails. */
void version_print(FILE *f);

/* The sources' git describe ("unknown" when the build did not know it): what
 * the ranks of one job must agree on (the rendezvous' "version" item). */
const char *version_source(void);

#endif
