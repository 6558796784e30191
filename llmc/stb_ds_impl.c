// The one translation unit that holds stb_ds's implementation.
#define STB_DS_IMPLEMENTATION
#include "stb_ds.h"
