/* The vectorizable exp and erf used by the kernels, against double-precision libm. */
#include "harness.h"
#include "kernels/fastmath.h"

int main(void) {
    double worst_exp = 0, worst_erf = 0;
    for (int i = -800000; i <= 800000; i++) {
        float x = (float)i * 1e-4f;
        double e = exp((double)x), r = fabs(tlm_expf(x) - e) / e;
        worst_exp = r > worst_exp ? r : worst_exp;
        double a = fabs(tlm_erff(x / 8) - erf((double)(x / 8)));
        worst_erf = a > worst_erf ? a : worst_erf;
    }
    printf("exp max relative error %.3g, erf max absolute error %.3g\n", worst_exp, worst_erf);
    CHECK(worst_exp < 5e-7, "exp relative error %.3g", worst_exp);
    /* The formula's 1.5e-7 plus float rounding of its terms. */
    CHECK(worst_erf < 1e-6, "erf absolute error %.3g", worst_erf);
    CHECK(tlm_expf(-200.0f) < 1e-37f && tlm_expf(-200.0f) >= 0.0f, "underflow clamps");
    CHECK(tlm_expf(0.0f) == 1.0f, "exp(0) = 1");
    CHECK(isnan(tlm_expf(NAN)) && isnan(tlm_erff(NAN)), "NaN propagates");
    CHECK(tlm_expf(INFINITY) > 1e38f && tlm_expf(-INFINITY) < 1e-37f, "infinities clamp");
    CHECK_NEAR(tlm_sigmoidf(0.0f), 0.5, 1e-7);
    CHECK(tlm_sigmoidf(-100.0f) >= 0.0f && tlm_sigmoidf(100.0f) <= 1.0f, "sigmoid saturates");
    return t_finish("test_fastmath");
}
