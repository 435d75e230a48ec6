/* The vectorizable exp and erf used by the kernels, against double-precision libm. */
#include <string.h>

#include "harness.h"
#include "kernels/fastmath.h"
#include "kernels/kernels.h"

int main(void) {
    double worst_exp = 0, worst_erf = 0;
    for (int i = -800000; i <= 800000; i++) {
        float x = (float)i * 1e-4f;
        double e = exp((double)x), r = fabs(k_expf(x) - e) / e;
        worst_exp = r > worst_exp ? r : worst_exp;
        double a = fabs(k_erff(x / 8) - erf((double)(x / 8)));
        worst_erf = a > worst_erf ? a : worst_erf;
    }
    printf("exp max relative error %.3g, erf max absolute error %.3g\n", worst_exp, worst_erf);
    CHECK(worst_exp < 5e-7, "exp relative error %.3g", worst_exp);
    /* The formula's 1.5e-7 plus float rounding of its terms. */
    CHECK(worst_erf < 1e-6, "erf absolute error %.3g", worst_erf);
    CHECK(k_expf(-200.0f) < 1e-37f && k_expf(-200.0f) >= 0.0f, "underflow clamps");
    CHECK(k_expf(0.0f) == 1.0f, "exp(0) = 1");
    CHECK(isnan(k_expf(NAN)) && isnan(k_erff(NAN)), "NaN propagates");
    CHECK(k_expf(INFINITY) > 1e38f && k_expf(-INFINITY) < 1e-37f, "infinities clamp");
    /* k_tanhf (soft caps): relative error over both of its formulas and their seam at 0.3 */
    double worst_tanh = 0;
    for (int i = -200000; i <= 200000; i++) {
        float x = (float)i * 1e-4f;
        double t = tanh((double)x), r = i ? fabs(k_tanhf(x) - t) / fabs(t) : fabs(k_tanhf(x));
        worst_tanh = r > worst_tanh ? r : worst_tanh;
    }
    printf("tanh max relative error %.3g\n", worst_tanh);
    CHECK(worst_tanh < 1e-6, "tanh relative error %.3g", worst_tanh);
    CHECK(k_tanhf(1e30f) == 1.0f && k_tanhf(-INFINITY) == -1.0f && isnan(k_tanhf(NAN)),
          "tanh saturates, NaN propagates");
    CHECK_NEAR(k_sigmoidf(0.0f), 0.5, 1e-7);
    CHECK(k_sigmoidf(-100.0f) >= 0.0f && k_sigmoidf(100.0f) <= 1.0f, "sigmoid saturates");
    /* k_expf_nonpos: k_expf's bits for x <= 0 (the GELU gradient relies on it). */
    int differ = 0;
    for (int i = -900000; i <= 0; i++) {
        float x = (float)i * 1e-4f, a = k_expf(x), b = k_expf_nonpos(x);
        differ += memcmp(&a, &b, sizeof a) != 0;
    }
    CHECK(differ == 0, "k_expf_nonpos differs from k_expf at %d points", differ);
    /* The GELU forward and gradient of training (k_act_fwd_grad) against double x Phi(x) and
     * Phi(x) + x phi(x); a NaN input gives NaNs in both. */
    enum { G = 4003 };
    static float gx[G + 1], gy[G + 1];
    for (int i = 0; i < G; i++) gx[i] = -10.0f + 20.0f * (float)i / (G - 1);
    gx[G] = NAN;
    float in[G];
    memcpy(in, gx, sizeof in);
    k_act_fwd_grad(gy, gx, G + 1, K_ACT_GELU);
    double worst_y = 0, worst_g = 0;
    for (int i = 0; i < G; i++) {
        double v = in[i], cdf = 0.5 * (1.0 + erf(v / sqrt(2.0)));
        double pdf = exp(-0.5 * v * v) / sqrt(2.0 * 3.14159265358979323846);
        double ey = fabs(gy[i] - v * cdf), eg = fabs(gx[i] - (cdf + v * pdf));
        worst_y = ey > worst_y ? ey : worst_y;
        worst_g = eg > worst_g ? eg : worst_g;
    }
    CHECK(worst_y < 1e-5 && worst_g < 1e-5, "GELU off by %.3g (value), %.3g (gradient)", worst_y,
          worst_g);
    CHECK(isnan(gy[G]) && isnan(gx[G]), "a NaN into the GELU gradient did not come out NaN");
    return t_finish("test_fastmath");
}
