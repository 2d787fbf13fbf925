// Compiled only to produce the precompiled header for executables (see pch.h).
int main() { return 0; }
