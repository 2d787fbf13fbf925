// SHA-256 and HMAC-SHA-256 against the published test vectors (FIPS 180-4's examples,
// RFC 4231), block boundaries included: the store's handshake depends on them.
#include "sha256.h"

#include <gtest/gtest.h>

#include <string>

#include "random_bytes.h"

namespace datapar::detail {
namespace {

std::string hex(const Sha256Digest& d) { return to_hex(d.data(), d.size()); }

TEST(Sha256, PublishedVectors) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PiecesGiveTheWholesDigest) {
  const std::string text(1000, 'x');
  for (size_t cut : {0, 1, 55, 56, 63, 64, 65, 999}) {
    Sha256 h;
    h.update(text.substr(0, cut)).update(text.substr(cut));
    EXPECT_EQ(h.finish(), sha256(text)) << "cut at " << cut;
  }
}

TEST(HmacSha256, Rfc4231) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than a block is hashed first.
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // A key of exactly one block is used as it is.
  EXPECT_EQ(hex(hmac_sha256(std::string(64, 'k'), "")), "83026a325aaee70e36cfe607536aa1054104ad1077c36134810d4ccded1ccd3b");
}

}  // namespace
}  // namespace datapar::detail
