// Compiled only to produce the shared precompiled header (see pch.h).
